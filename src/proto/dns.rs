//! DNS messages as dnspr reads and answers them (3proxy's dnspr.c): a
//! query's one question, and the answers built byte by byte from it (its
//! ID and question repeated as they came), so any datagram the question
//! reader took has an answer. `services::dnspr` receives the datagrams,
//! decides the answer and sends it.
//!
//! Invariant: pure; nothing here does IO, and every index is checked:
//! nothing here can panic.

use std::net::IpAddr;

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
}
