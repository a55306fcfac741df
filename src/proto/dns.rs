//! DNS messages, both sides.
//!
//! The server's (3proxy's dnspr.c): a query's one question, and the
//! answers built byte by byte from it (its ID and question repeated as
//! they came), so any datagram the question reader took has an answer.
//! `services::dnspr` receives the datagrams, decides the answer and sends
//! it.
//!
//! The resolver's (`resolve`, `nserver`): a query with an ID from the
//! OS's CSPRNG, and the check a reply must pass (the same ID, question,
//! type and class) before its answer is taken. `resolve` sends and
//! receives.
//!
//! Invariant: pure; nothing here does IO, and every index is checked:
//! nothing here can panic.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use simple_dns::rdata::RData;
use simple_dns::{
    Label, Name, Packet, PacketFlag, Question as DnsQuestion, CLASS, QCLASS, QTYPE, TYPE,
};

use crate::res::Res;

/// TTL of `-F` and PTR answers.
pub(crate) const FIXED_TTL: u32 = 3600;

pub(crate) const TYPE_A: u16 = 1;
pub(crate) const TYPE_PTR: u16 = 12;
pub(crate) const TYPE_AAAA: u16 = 28;

/// Result codes (3proxy's dnspr.c).
const RES_QDCOUNT: Res = Res::DNS_QDCOUNT;
const RES_NAME: Res = Res::DNS_NAME;

/// The longest name a DNS message carries, in octets on the wire.
const MAX_NAME_WIRE: usize = 255;

/// A query's one question, as 3proxy reads it.
#[derive(Debug)]
pub(crate) struct Question<'a> {
    msg: &'a [u8],
    /// The labels joined with dots.
    pub(crate) host: String,
    /// Every label is 1 to 63 bytes of UTF-8: a name the resolver can ask.
    pub(crate) plain: bool,
    pub(crate) qtype: u16,
    /// Offset just past the question (its class).
    pub(crate) end: usize,
}

impl<'a> Question<'a> {
    /// The question of a query of 14 to 1000 bytes; Err is the code:
    /// 816 unless there is exactly one question, 817 if it runs past the
    /// end of the datagram.
    pub(crate) fn parse(msg: &'a [u8]) -> Result<Question<'a>, Res> {
        if msg.len() < 12 || msg[4] != 0 || msg[5] != 1 {
            return Err(RES_QDCOUNT);
        }
        let mut labels: Vec<&[u8]> = Vec::new();
        let mut pos = 12;
        loop {
            let Some(&c) = msg.get(pos) else {
                return Err(RES_NAME);
            };
            if c == 0 {
                break;
            }
            let c = usize::from(c);
            let Some(label) = msg.get(pos + 1..pos + 1 + c) else {
                return Err(RES_NAME);
            };
            labels.push(label);
            pos += c + 1;
        }
        // The terminating zero, the type and the class.
        let end = pos + 5;
        if end > msg.len() {
            return Err(RES_NAME);
        }
        let joined = labels.join(&b'.');
        let host = String::from_utf8_lossy(&joined).into_owned();
        // RFC 1035 2.3.4: at most 255 octets on the wire, the lengths and
        // the root's zero included. A longer name is not one dnspr answers
        // itself: no DNS library would read the reply.
        let plain = !labels.is_empty()
            && pos + 1 - 12 <= MAX_NAME_WIRE
            && labels.iter().all(|l| l.len() <= 63)
            && std::str::from_utf8(&joined).is_ok();
        Ok(Question {
            msg,
            host,
            plain,
            qtype: u16::from_be_bytes([msg[pos + 1], msg[pos + 2]]),
            end,
        })
    }

    /// The header and question of the reply: flags "response,
    /// authoritative, recursion desired and available", `rcode`, one
    /// question and `answers` answers.
    fn head(&self, rcode: u8, answers: u8) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.end + 32);
        out.extend_from_slice(&self.msg[..self.end]);
        out[2] = 0x85;
        out[3] = 0x80 | rcode;
        out[6..12].copy_from_slice(&[0, answers, 0, 0, 0, 0]);
        out
    }

    /// One answer record for the question's name (a pointer to it).
    fn answer(&self, mut out: Vec<u8>, ttl: u32, rdata: &[u8]) -> Vec<u8> {
        out.extend_from_slice(&[0xc0, 0x0c]);
        out.extend_from_slice(&self.qtype.to_be_bytes());
        out.extend_from_slice(&[0, 1]);
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(rdata);
        out
    }

    pub(crate) fn addr_reply(&self, ip: IpAddr, ttl: u32) -> Vec<u8> {
        let rdata: Vec<u8> = match ip {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        self.answer(self.head(0, 1), ttl, &rdata)
    }

    pub(crate) fn ptr_reply(&self) -> Vec<u8> {
        self.answer(self.head(0, 1), FIXED_TTL, b"\x063proxy\x00")
    }

    pub(crate) fn nxdomain_reply(&self) -> Vec<u8> {
        self.head(3, 0)
    }
}

/// A server's reply without answers, made NXDOMAIN (as 3proxy does).
pub(crate) fn nxdomain(mut reply: Vec<u8>) -> Vec<u8> {
    reply[2] = 0x85;
    reply[3] = 0x83;
    reply
}

// ---------------------------------------------------------------------------
// The resolver's side (`resolve`): a query of ours, and the checks its
// reply must pass before an answer is taken from it.

/// Longest name (in its dotted form) and label a query may carry.
const MAX_NAME: usize = 253;
const MAX_LABEL: usize = 63;

/// The record types we ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Qt {
    A,
    Aaaa,
    Ptr,
}

impl Qt {
    pub(crate) fn qtype(self) -> QTYPE {
        QTYPE::TYPE(match self {
            Qt::A => TYPE::A,
            Qt::Aaaa => TYPE::AAAA,
            Qt::Ptr => TYPE::PTR,
        })
    }
}

/// What a valid reply said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// An address of the type asked for, with its TTL in seconds.
    Addr(IpAddr, u32),
    /// A PTR answer's name.
    Name(String),
    /// A response with no record of that type (NXDOMAIN, NODATA, ...).
    None,
}

/// A reply that passed the checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Done(Answer),
    /// TC was set: ask again over TCP.
    Truncated,
}

/// One query in wire form, and what its reply must repeat.
pub(crate) struct Query {
    pub(crate) id: u16,
    /// The name's labels, lowercased, for comparing with the reply's.
    labels: Vec<Vec<u8>>,
    qt: Qt,
    /// The query as it is sent.
    pub(crate) wire: Vec<u8>,
}

impl Query {
    pub(crate) fn new(name: &str, qt: Qt) -> io::Result<Query> {
        let name = name.strip_suffix('.').unwrap_or(name);
        let invalid = || io::Error::new(io::ErrorKind::InvalidInput, "not a valid DNS name");
        // Split on dots ourselves: the name is bytes as the client sent
        // them, with no escapes, and no empty or over-long label.
        let parts: Vec<&[u8]> = name.as_bytes().split(|&c| c == b'.').collect();
        if name.len() > MAX_NAME || parts.iter().any(|l| l.is_empty() || l.len() > MAX_LABEL) {
            return Err(invalid());
        }
        let labels: Vec<Vec<u8>> = parts.iter().map(|l| l.to_ascii_lowercase()).collect();
        let qname = Name::new_with_labels(
            &parts
                .iter()
                .map(|&l| Label::new_unchecked(l))
                .collect::<Vec<_>>(),
        );
        let id = random_id();
        let mut p = Packet::new_query(id);
        p.set_flags(PacketFlag::RECURSION_DESIRED);
        p.questions.push(DnsQuestion::new(
            qname,
            qt.qtype(),
            QCLASS::CLASS(CLASS::IN),
            false,
        ));
        let wire = p.build_bytes_vec().map_err(|_| invalid())?;
        Ok(Query {
            id,
            labels,
            qt,
            wire,
        })
    }

    /// The reply's meaning if it answers this query; None if it must be
    /// dropped (not a response, another ID or question, or malformed).
    pub(crate) fn check(&self, msg: &[u8]) -> Option<Reply> {
        let p = Packet::parse(msg).ok()?;
        if p.id() != self.id || !p.has_flags(PacketFlag::RESPONSE) {
            return None;
        }
        let [q] = p.questions.as_slice() else {
            return None;
        };
        let same_name = q
            .qname
            .as_bytes()
            .map(|l| l.to_ascii_lowercase())
            .eq(self.labels.iter().cloned());
        if !same_name || q.qtype != self.qt.qtype() || q.qclass != QCLASS::CLASS(CLASS::IN) {
            return None;
        }
        if p.has_flags(PacketFlag::TRUNCATION) {
            return Some(Reply::Truncated);
        }
        let found = p.answers.iter().find_map(|rr| {
            if rr.class != CLASS::IN {
                return None;
            }
            match (&rr.rdata, self.qt) {
                (RData::A(a), Qt::A) => {
                    Some(Answer::Addr(Ipv4Addr::from(a.address).into(), rr.ttl))
                }
                (RData::AAAA(a), Qt::Aaaa) => {
                    Some(Answer::Addr(Ipv6Addr::from(a.address).into(), rr.ttl))
                }
                (RData::PTR(n), Qt::Ptr) => Some(Answer::Name(n.0.to_string())),
                _ => None,
            }
        });
        Some(Reply::Done(found.unwrap_or(Answer::None)))
    }
}

/// A 16-bit query ID nobody off this host can predict (RFC 5452): from
/// the OS's CSPRNG (`random`).
fn random_id() -> u16 {
    crate::random::u16()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A query for `name` of `qtype`, ID 0x1234, with an EDNS record
    /// after the question (which no answer repeats).
    pub(crate) fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut m = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1];
        for l in name.split('.').filter(|l| !l.is_empty()) {
            m.push(l.len() as u8);
            m.extend_from_slice(l.as_bytes());
        }
        m.push(0);
        m.extend_from_slice(&qtype.to_be_bytes());
        m.extend_from_slice(&[0, 1]);
        m.extend_from_slice(&[0, 0, 41, 4, 0, 0, 0, 0, 0, 0, 0]);
        m
    }

    #[test]
    fn malformed_questions_have_codes() {
        let mut two = query("a.test", TYPE_A);
        two[5] = 2;
        assert_eq!(Question::parse(&two).unwrap_err(), RES_QDCOUNT);
        let q = query("a.test", TYPE_A);
        // Cut inside the name, inside the type, inside the class.
        for cut in [14, 19, 21, 23] {
            assert_eq!(Question::parse(&q[..cut]).unwrap_err(), RES_NAME, "{cut}");
        }
        assert!(Question::parse(&q[..24]).is_ok());
        // A label running past the end.
        let mut long = q.clone();
        long[12] = 200;
        assert_eq!(Question::parse(&long).unwrap_err(), RES_NAME);
        // A compression pointer is a 192-byte label: not a name to ask.
        let mut m = vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0];
        m.extend(std::iter::repeat_n(b'x', 192));
        m.extend_from_slice(&[0, 0, 1, 0, 1]);
        let q = Question::parse(&m).unwrap();
        assert!(!q.plain);
        // 255 octets on the wire is a name; 256 is not one to answer.
        for (last, plain) in [(61u8, true), (62, false)] {
            let mut m = vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
            for n in [63, 63, 63, last] {
                m.push(n);
                m.extend(std::iter::repeat_n(b'a', usize::from(n)));
            }
            m.extend_from_slice(&[0, 0, 1, 0, 1]);
            let q = Question::parse(&m).unwrap();
            assert_eq!(q.plain, plain, "a name of {} octets", m.len() - 16);
        }
    }

    /// A reply to `q` built by hand, with these answers.
    fn reply(q: &Query, answers: &[(&str, RData<'static>, u32)]) -> Vec<u8> {
        let mut p = Packet::new_reply(q.id);
        let sent = Packet::parse(&q.wire).unwrap();
        p.questions.push(sent.questions[0].clone());
        for (name, rdata, ttl) in answers {
            p.answers.push(simple_dns::ResourceRecord::new(
                Name::new_unchecked(name),
                CLASS::IN,
                *ttl,
                rdata.clone(),
            ));
        }
        p.build_bytes_vec_compressed().unwrap()
    }

    pub(crate) fn a(ip: [u8; 4]) -> RData<'static> {
        RData::A(simple_dns::rdata::A {
            address: u32::from(Ipv4Addr::from(ip)),
        })
    }

    #[test]
    fn checks_replies() {
        let q = Query::new("Some.Test.", Qt::A).unwrap();
        let good = reply(&q, &[("some.test", a([10, 1, 2, 3]), 60)]);
        assert_eq!(
            q.check(&good),
            Some(Reply::Done(Answer::Addr("10.1.2.3".parse().unwrap(), 60)))
        );
        // The question's case may differ (0x20 randomizing servers).
        let mut upper = good.clone();
        for b in &mut upper[12..] {
            if b.is_ascii_lowercase() {
                *b = b.to_ascii_uppercase();
                break;
            }
        }
        assert!(matches!(q.check(&upper), Some(Reply::Done(_))));
        // Another ID.
        let mut other = good.clone();
        other[0] ^= 0xff;
        assert_eq!(q.check(&other), None);
        // Not a response (QR clear).
        let mut query = good.clone();
        query[2] &= 0x7f;
        assert_eq!(q.check(&query), None);
        // Another question.
        let q2 = Query::new("other.test", Qt::A).unwrap();
        let mut wrong = reply(&q2, &[("other.test", a([10, 9, 9, 9]), 60)]);
        wrong[..2].copy_from_slice(&q.id.to_be_bytes());
        assert_eq!(q.check(&wrong), None);
        // Another type.
        let q6 = Query::new("some.test", Qt::Aaaa).unwrap();
        let mut wrong = reply(&q6, &[]);
        wrong[..2].copy_from_slice(&q.id.to_be_bytes());
        assert_eq!(q.check(&wrong), None);
        // No answer of the type: a valid "nothing".
        assert_eq!(q.check(&reply(&q, &[])), Some(Reply::Done(Answer::None)));
        // Truncated.
        let mut tc = good.clone();
        tc[2] |= 0x02;
        assert_eq!(q.check(&tc), Some(Reply::Truncated));
    }

    #[test]
    fn skips_records_of_other_types() {
        let q = Query::new("www.test", Qt::A).unwrap();
        let cname = RData::CNAME(simple_dns::rdata::CNAME(Name::new_unchecked("real.test")));
        let msg = reply(
            &q,
            &[("www.test", cname, 300), ("real.test", a([10, 0, 0, 7]), 0)],
        );
        assert_eq!(
            q.check(&msg),
            Some(Reply::Done(Answer::Addr("10.0.0.7".parse().unwrap(), 0)))
        );
    }

    /// Cut, flipped and random bytes must never panic the checker.
    #[test]
    fn garbage_replies_never_panic() {
        let q = Query::new("some.test", Qt::A).unwrap();
        let good = reply(&q, &[("some.test", a([10, 1, 2, 3]), 60)]);
        for n in 0..good.len() {
            let _ = q.check(&good[..n]);
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let mut m = good.clone();
            for _ in 0..(next() % 4 + 1) {
                let i = (next() as usize) % m.len();
                m[i] = next() as u8;
            }
            let _ = q.check(&m);
            let len = (next() % 600) as usize;
            let junk: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = q.check(&junk);
        }
        // Compression pointers that loop or point forward.
        let mut looped = good.clone();
        looped.truncate(12);
        looped.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        let _ = q.check(&looped);
    }

    #[test]
    fn query_ids_vary() {
        let ids: std::collections::HashSet<u16> = (0..64).map(|_| random_id()).collect();
        assert!(ids.len() > 48, "{} distinct of 64", ids.len());
    }

    #[test]
    fn bad_names_are_not_queried() {
        assert!(Query::new("", Qt::A).is_err());
        assert!(Query::new("a..b", Qt::A).is_err());
        assert!(Query::new(&"x".repeat(64), Qt::A).is_err());
        assert!(Query::new(&["abc"; 80].join("."), Qt::A).is_err());
    }
}
