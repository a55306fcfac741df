//! `dnspr`, the caching DNS proxy: queries built with simple-dns go to
//! the service over UDP; a [`TestDns`] behind it (`nserver`) answers and
//! counts what it is asked. Answers from the resolver (`nscache`,
//! `nsrecord`), `-F`, `-s`, forwarding of other types, NXDOMAIN, the PTR
//! of the service's own address, ACL refusals, malformed datagrams and
//! the log records.

use std::net::{IpAddr, UdpSocket};
use std::time::Duration;

use simple_dns::rdata::RData;
use simple_dns::{Name, Packet, PacketFlag, Question, CLASS, QCLASS, QTYPE, RCODE, TYPE};

use crate::resolve::{Style, TestDns};
use crate::util::*;

/// Code, client port, server asked and the text (`TYPE/NAME/ADDRESS`).
const FMT: &str = "L%N %E %c %R %T";

/// The service of these tests, on a UDP port of 127.0.0.1.
const DNSPR: Service = Service::udp("dnspr", FMT);

fn query(id: u16, name: &str, t: TYPE) -> Vec<u8> {
    let mut p = Packet::new_query(id);
    p.set_flags(PacketFlag::RECURSION_DESIRED);
    p.questions.push(Question::new(
        Name::new_unchecked(name),
        QTYPE::TYPE(t),
        QCLASS::CLASS(CLASS::IN),
        false,
    ));
    p.build_bytes_vec().unwrap()
}

/// Send `msg` from a new client socket; returns the socket and its port.
fn send(port: u16, msg: &[u8]) -> (UdpSocket, u16) {
    let c = udp_client();
    c.send_to(msg, localhost(port)).expect("send the query");
    let cport = c.local_addr().unwrap().port();
    (c, cport)
}

/// The reply to `msg`, which must come within the test timeout.
fn ask(port: u16, msg: &[u8]) -> (Vec<u8>, u16) {
    let (c, cport) = send(port, msg);
    let mut buf = vec![0u8; 4096];
    let (n, from) = c.recv_from(&mut buf).expect("a reply from dnspr");
    assert_eq!(from, localhost(port));
    buf.truncate(n);
    (buf, cport)
}

/// The A/AAAA addresses and TTLs of a reply with ID `id`, and its code.
fn addresses(reply: &[u8], id: u16) -> (RCODE, Vec<(IpAddr, u32)>) {
    let p = Packet::parse(reply).expect("a well-formed reply");
    assert_eq!(p.id(), id);
    assert!(p.has_flags(PacketFlag::RESPONSE));
    let found = p
        .answers
        .iter()
        .filter_map(|rr| match &rr.rdata {
            RData::A(a) => Some((IpAddr::from(std::net::Ipv4Addr::from(a.address)), rr.ttl)),
            RData::AAAA(a) => Some((std::net::Ipv6Addr::from(a.address).into(), rr.ttl)),
            _ => None,
        })
        .collect();
    (p.rcode(), found)
}

/// The record of the query from client port `cport`.
fn record(log: &std::path::Path, cport: u16) -> String {
    read_log_line(log, &format!("of client port {cport}"), |l| {
        l.split(' ').nth(2) == Some(cport.to_string().as_str())
    })
}

/// No datagram comes back on `c` within a second.
fn no_reply(c: &UdpSocket) {
    c.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut buf = [0u8; 512];
    if let Ok((n, _)) = c.recv_from(&mut buf) {
        panic!("expected no reply, got {:?}", &buf[..n]);
    }
}

#[test]
fn nserver_answers_and_nscache_answers_the_second_query() {
    let dns = TestDns::start(Style::Plain, &[("some.test", "10.1.2.3")]);
    let (_proxy, port, log) = DNSPR.start(
        "dnspr_cache",
        &format!("{}nscache 256\n", dns.nserver()),
        "",
    );
    for id in [7, 8] {
        let (reply, cport) = ask(port, &query(id, "some.test", TYPE::A));
        let (rcode, found) = addresses(&reply, id);
        assert_eq!(rcode, RCODE::NoError);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "10.1.2.3".parse::<IpAddr>().unwrap());
        assert!(found[0].1 <= 300 && found[0].1 > 200, "ttl {}", found[0].1);
        let rec = record(&log, cport);
        let asked = if id == 7 {
            "127.0.0.1".to_string()
        } else {
            // From the cache: no server asked.
            "0.0.0.0".to_string()
        };
        assert_eq!(
            rec,
            format!("DNSPR 00000 {cport} {asked} 0001/some.test/10.1.2.3")
        );
    }
    assert_eq!(dns.count("some.test A"), 1, "asked: {:?}", dns.asked());
}

#[test]
fn nsrecord_is_answered_without_asking() {
    let dns = TestDns::start(Style::Plain, &[("rec.test", "10.5.5.5")]);
    let pre = format!(
        "{}nsrecord rec.test 10.9.9.9\nnsrecord rec.test ::9\n",
        dns.nserver()
    );
    let (_proxy, port, log) = DNSPR.start("dnspr_nsrecord", &pre, "");
    let (reply, cport) = ask(port, &query(1, "rec.test", TYPE::A));
    assert_eq!(
        addresses(&reply, 1).1[0].0,
        "10.9.9.9".parse::<IpAddr>().unwrap()
    );
    record(&log, cport);
    let (reply, _) = ask(port, &query(2, "REC.test", TYPE::AAAA));
    assert_eq!(
        addresses(&reply, 2).1[0].0,
        "::9".parse::<IpAddr>().unwrap()
    );
    assert!(dns.asked().is_empty(), "asked: {:?}", dns.asked());
}

#[test]
fn other_types_are_forwarded_and_empty_replies_become_nxdomain() {
    let dns = TestDns::start(Style::Plain, &[]);
    dns.add_ptr("4.3.2.1.in-addr.arpa", "host.example");
    let (_proxy, port, log) = DNSPR.start("dnspr_forward", &dns.nserver(), "");
    // Answered by the server: passed on as it is.
    let (reply, cport) = ask(port, &query(3, "4.3.2.1.in-addr.arpa", TYPE::PTR));
    let p = Packet::parse(&reply).unwrap();
    assert_eq!(p.id(), 3);
    assert!(
        matches!(&p.answers[..], [rr] if matches!(&rr.rdata, RData::PTR(n) if n.0.to_string() == "host.example")),
        "{p:?}"
    );
    assert!(record(&log, cport).starts_with(&format!("DNSPR 00000 {cport} 127.0.0.1 000c/")));
    // No answer: NXDOMAIN, code 888. An unknown A name is forwarded too.
    for (id, t, name) in [(4, TYPE::TXT, "txt.test"), (5, TYPE::A, "none.test")] {
        let (reply, cport) = ask(port, &query(id, name, t));
        let (rcode, found) = addresses(&reply, id);
        assert_eq!(rcode, RCODE::NameError);
        assert!(found.is_empty());
        let rec = record(&log, cport);
        assert!(
            rec.starts_with(&format!("DNSPR 00888 {cport} 127.0.0.1")),
            "{rec}"
        );
    }
    assert_eq!(dns.count("txt.test TXT"), 1, "asked: {:?}", dns.asked());
    // Once by the resolver, once forwarded.
    assert_eq!(dns.count("none.test A"), 2, "asked: {:?}", dns.asked());
}

#[test]
fn without_nserver_unknown_names_are_nxdomain_and_own_ptr_is_3proxy() {
    let (_proxy, port, log) = DNSPR.start("dnspr_alone", "", "");
    let (reply, cport) = ask(port, &query(9, "nowhere.test", TYPE::A));
    assert_eq!(addresses(&reply, 9), (RCODE::NameError, vec![]));
    assert_eq!(
        record(&log, cport),
        format!("DNSPR 00888 {cport} 0.0.0.0 0001/nowhere.test/")
    );
    let (reply, _) = ask(port, &query(10, "1.0.0.127.in-addr.arpa", TYPE::PTR));
    let p = Packet::parse(&reply).unwrap();
    assert!(
        matches!(&p.answers[..], [rr] if matches!(&rr.rdata, RData::PTR(n) if n.0.to_string() == "3proxy")),
        "{p:?}"
    );
}

#[test]
fn fake_address_and_simple_forwarding() {
    let dns = TestDns::start(Style::Plain, &[("s.test", "10.3.3.3")]);
    let pre = format!("{}nscache 256\n", dns.nserver());
    let (_proxy, port, _log) = DNSPR.start("dnspr_fake", &pre, "-F10.7.7.7 -s");
    let (reply, _) = ask(port, &query(11, "any.test", TYPE::A));
    assert_eq!(
        addresses(&reply, 11).1,
        vec![("10.7.7.7".parse().unwrap(), 3600)]
    );
    // -s: AAAA (no -F6 given) and the rest go to the server every time.
    for id in [12, 13] {
        let (reply, _) = ask(port, &query(id, "s.test", TYPE::AAAA));
        assert_eq!(addresses(&reply, id).0, RCODE::NameError);
    }
    assert_eq!(dns.count("s.test AAAA"), 2, "asked: {:?}", dns.asked());
    assert!(dns.count("any.test A") == 0);
}

#[test]
fn acl_refusals_get_no_reply() {
    let dns = TestDns::start(Style::Plain, &[("a.test", "10.1.1.1")]);
    let denied = free_udp_port();
    // A host in a deny rule: dnspr checks before it reads the name, so
    // the rule matches every query (as in 3proxy).
    let pre = format!(
        "{}allow * 10.0.0.1\ndnspr -i127.0.0.1 -p{denied}\nflush\ndeny * * other.test\n",
        dns.nserver()
    );
    let (_proxy, port, log) = DNSPR.start("dnspr_acl", &pre, "");
    for (p, code) in [(denied, "00003"), (port, "00001")] {
        let (c, cport) = send(p, &query(20, "a.test", TYPE::A));
        let rec = record(&log, cport);
        assert_eq!(rec, format!("DNSPR {code} {cport} 0.0.0.0 0000//"));
        no_reply(&c);
    }
    assert!(dns.asked().is_empty(), "asked: {:?}", dns.asked());
}

#[test]
fn malformed_datagrams_are_logged_and_dropped() {
    let (_proxy, port, log) = DNSPR.start("dnspr_garbage", "", "");
    let mut two = query(30, "a.test", TYPE::A);
    two[5] = 2;
    let mut cut = query(31, "a.test", TYPE::A);
    cut.truncate(cut.len() - 3);
    let mut long = query(32, "a.test", TYPE::A);
    long[12] = 60;
    for (msg, code) in [
        (b"hello".to_vec(), "00814"),
        (vec![0xff; 1001], "00814"),
        (two, "00816"),
        (cut, "00817"),
        (long, "00817"),
    ] {
        let (c, cport) = send(port, &msg);
        assert_eq!(
            record(&log, cport),
            format!("DNSPR {code} {cport} 0.0.0.0 0000//")
        );
        no_reply(&c);
    }
    // Still serving.
    let (reply, _) = ask(port, &query(33, "b.test", TYPE::A));
    assert_eq!(addresses(&reply, 33).0, RCODE::NameError);
}
