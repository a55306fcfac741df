//! `dnspr`: the caching DNS proxy (3proxy's dnspr.c).
//!
//! Every datagram on the service's UDP socket is one query, served by a
//! thread of its own, as 3proxy serves it: the service thread only
//! receives, and at most `maxconn` queries are in progress at once (a
//! datagram beyond that is dropped, as a full socket buffer would drop it).
//! A query waits at most the DNS timeout per server asked, so a slow
//! server holds only that query's thread.
//!
//! A query is answered by the service itself when it can be:
//! - A and AAAA: with the `-F` address of that family, else (unless `-s`)
//!   from the resolver's `nsrecord` entries, its cache and the `nserver`s
//!   (never from getaddrinfo or `fakeresolve`), with the record's TTL;
//! - PTR of the service's own IPv4 address: the name `3proxy`.
//!
//! Anything else (other types, names the resolver did not find) is sent
//! as it came to the first `nserver`: a reply with answers goes back to
//! the client as it is, one without becomes NXDOMAIN. With no `nserver`
//! the service answers NXDOMAIN itself. Malformed datagrams (too short or
//! over 1000 bytes, not exactly one question, a name running past the
//! end) get no reply at all; like refused ones, they are only logged.
//!
//! The access check comes before the question is read, with operation
//! DNSRESOLVE and no destination, as in 3proxy: the client's address,
//! the time and the operation select ACL entries; destination fields do
//! not (an entry's host or address list matches every query).
//!
//! Answers are built byte by byte from the query (its ID and question
//! repeated as they came), so any datagram that passed the checks above
//! has an answer; every index is checked, nothing here can panic.

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::access::{self, Op, Request};
use crate::conf::token::quote;
use crate::logformat::LogRecord;
use crate::net::read_exact_by;
use crate::proto::dns::{nxdomain, Question, FIXED_TTL, TYPE_A, TYPE_AAAA, TYPE_PTR};
use crate::res::Res;
use crate::resolve::{self, NameServer};
use crate::running::Running;
use crate::service::{Service, ServiceOpts};
use crate::timeouts::Timeouts;

/// Datagrams shorter than this (or equal) or longer than [`MAX_QUERY`]
/// are dropped (code 814).
const MIN_QUERY: usize = 13;
const MAX_QUERY: usize = 1000;
/// Largest reply read from a server over TCP (code 833 beyond).
const MAX_TCP_REPLY: usize = 4096;
/// Largest datagram read.
const BUF: usize = 65536;

/// Result codes (3proxy's dnspr.c; the question's are `proto::dns`'s).
const RES_SIZE: Res = Res::DNS_SIZE;
const RES_SOCKET: Res = Res::DNS_SOCKET;
const RES_SEND_LOCAL: Res = Res::DNS_SEND_LOCAL;
const RES_SEND_SERVER: Res = Res::DNS_SEND_SERVER;
const RES_NO_REPLY: Res = Res::DNS_NO_REPLY;
const RES_SEND_FORWARDED: Res = Res::DNS_SEND_FORWARDED;
const RES_CONNECT: Res = Res::DNS_CONNECT;
const RES_TCP_SHORT: Res = Res::DNS_TCP_SHORT;
const RES_TCP_LONG: Res = Res::DNS_TCP_LONG;
const RES_NXDOMAIN: Res = Res::DNS_NXDOMAIN;

/// `-F`: the addresses every A / AAAA query is answered with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fake {
    pub v4: Option<Ipv4Addr>,
    pub v6: Option<Ipv6Addr>,
}

/// The `-F` options among the service's options (kept raw by the common
/// parser): each takes an IP address, the last of each family wins.
pub fn fake(opts: &ServiceOpts) -> Result<Fake, String> {
    let mut f = Fake::default();
    for o in &opts.other {
        let Some(v) = o.strip_prefix("-F") else {
            continue;
        };
        match crate::net::parse_ip(v) {
            Some(IpAddr::V4(a)) => f.v4 = Some(a),
            Some(IpAddr::V6(a)) => f.v6 = Some(a),
            None => return Err(format!("'{}': -F takes an IP address", quote(o))),
        }
    }
    Ok(f)
}

/// The service thread: receive datagrams and start a thread for each,
/// until the service is stopped.
pub fn run(r: Arc<Running>, listen: UdpSocket) {
    let first = r.current();
    if !first.opts.silent {
        crate::acceptor::svc_record(&first, "Accepting connections");
    }
    drop(first);
    // Wake up once a second to notice a stop even without traffic.
    let _ = listen.set_read_timeout(Some(Duration::from_secs(1)));
    let listen = Arc::new(listen);
    let mut buf = vec![0u8; BUF];
    let mut last_warn: Option<Instant> = None;
    while !r.stopped() {
        let (n, from) = match listen.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e) if crate::net::is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {
                continue
            }
            Err(e) => {
                if !r.stopped() {
                    log::warn!("dnspr: recvfrom(): {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
        };
        let svc = r.current();
        if !crate::client::take_datagram_slot(&svc, &mut last_warn, "queries in progress") {
            continue;
        }
        // Code 21 stands if no thread could be started: the closure, and
        // the record in it, are then dropped, which frees the slot.
        let mut rec = QueryRecord::new(svc.clone(), from);
        rec.res = Res::NOMEM;
        let msg = buf[..n].to_vec();
        let sock = listen.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("dnspr:{}", svc.port()))
            .stack_size(svc.stack_size)
            .spawn(move || {
                let mut rec = rec;
                rec.res = Res::OK;
                serve(&mut rec, &sock, &msg);
            });
        if let Err(e) = spawned {
            log::error!("dnspr on {}: cannot start a thread: {e}", svc.listen);
        }
    }
}

/// Serve one query; the record is written when `rec` is dropped.
fn serve(rec: &mut QueryRecord, sock: &UdpSocket, msg: &[u8]) {
    let svc = rec.svc.clone();
    if msg.len() <= MIN_QUERY || msg.len() > MAX_QUERY {
        rec.res = RES_SIZE;
        return;
    }
    let local = listen_addr(&svc);
    let req = Request {
        op: Some(Op::DnsResolve),
        client: Some(rec.from),
        local,
        ..Default::default()
    };
    match access::authorize(&svc, &req) {
        Ok(g) => {
            rec.nolog = g.nolog;
            rec.user = g.user;
        }
        Err(res) => {
            rec.res = res;
            return;
        }
    }
    let q = match Question::parse(msg) {
        Ok(q) => q,
        Err(res) => {
            rec.res = res;
            return;
        }
    };
    rec.qtype = q.qtype;
    rec.host = Some(q.host.clone());
    let ctx = Ctx {
        fake: fake(&svc.opts).unwrap_or_default(),
        simple: svc.opts.s_option.is_some(),
        local: local.map(|a| a.ip()),
    };
    let (reply, res) = match local_answer(&q, &ctx, resolve::record) {
        Some(Local::Addr(r)) => {
            rec.addr = Some(r.ip);
            rec.remote = r.server;
            (q.addr_reply(r.ip, r.ttl), Res::OK)
        }
        Some(Local::Ptr) => (q.ptr_reply(), Res::OK),
        None => match resolve::first_server() {
            Some(server) => {
                rec.remote = Some(server.addr);
                match forward(&svc, server, msg, rec) {
                    Ok(reply) => {
                        let answered = reply[6] != 0 || reply[7] != 0;
                        let reply = if answered { reply } else { nxdomain(reply) };
                        if sock.send_to(&reply, rec.from).is_err() {
                            rec.res = RES_SEND_FORWARDED;
                        } else {
                            rec.res = if answered { Res::OK } else { RES_NXDOMAIN };
                        }
                        return;
                    }
                    Err(res) => {
                        rec.res = res;
                        return;
                    }
                }
            }
            None => (q.nxdomain_reply(), RES_NXDOMAIN),
        },
    };
    rec.res = match sock.send_to(&reply, rec.from) {
        Ok(_) => res,
        Err(_) => RES_SEND_LOCAL,
    };
}

fn listen_addr(svc: &Service) -> Option<SocketAddr> {
    match svc.listen {
        crate::net::Addr::Ip(a) => Some(a),
        _ => None,
    }
}

/// What the service knows without asking anyone.
struct Ctx {
    fake: Fake,
    /// `-s`: A and AAAA queries are forwarded too.
    simple: bool,
    /// The address the service listens on.
    local: Option<IpAddr>,
}

/// An answer the service gives itself.
#[derive(Debug, PartialEq, Eq)]
enum Local {
    Addr(resolve::Record),
    /// "3proxy", for the PTR of the service's own address.
    Ptr,
}

fn local_answer(
    q: &Question<'_>,
    ctx: &Ctx,
    lookup: impl Fn(&str, bool) -> Option<resolve::Record>,
) -> Option<Local> {
    let fixed = |ip: IpAddr| {
        Local::Addr(resolve::Record {
            ip,
            ttl: FIXED_TTL,
            server: None,
        })
    };
    match q.qtype {
        TYPE_A if ctx.fake.v4.is_some() => ctx.fake.v4.map(|a| fixed(a.into())),
        TYPE_AAAA if ctx.fake.v6.is_some() => ctx.fake.v6.map(|a| fixed(a.into())),
        TYPE_A | TYPE_AAAA if !ctx.simple && q.plain => {
            lookup(&q.host, q.qtype == TYPE_AAAA).map(Local::Addr)
        }
        TYPE_PTR => {
            let own = match ctx.local {
                Some(IpAddr::V4(a)) => a,
                _ => return None,
            };
            (reverse_v4(&q.host) == Some(own)).then_some(Local::Ptr)
        }
        _ => None,
    }
}

/// The IPv4 address of a name starting with four dotted numbers, in
/// reverse order (`1.0.0.127.in-addr.arpa` is 127.0.0.1); as 3proxy
/// reads them, a number above 255 spills into the next octet.
fn reverse_v4(host: &str) -> Option<Ipv4Addr> {
    let mut parts = host.split('.');
    let mut n = [0u32; 4];
    for slot in &mut n {
        let p = parts.next()?;
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *slot = p.parse().ok()?;
    }
    let [a, b, c, d] = n;
    Some(Ipv4Addr::from(
        (d << 24) ^ (c.wrapping_shl(16)) ^ (b.wrapping_shl(8)) ^ a,
    ))
}

/// Send the query as it came to `server` and return its reply (at least
/// 14 bytes, with the query's ID), or the code.
fn forward(
    svc: &Service,
    server: NameServer,
    msg: &[u8],
    rec: &mut QueryRecord,
) -> Result<Vec<u8>, Res> {
    let dns_timeout = svc.timeouts.get(Timeouts::DNS);
    let send_timeout = svc.timeouts.get(Timeouts::BYTE_LONG);
    let reply = if server.tcp {
        let mut s = TcpStream::connect_timeout(&server.addr, svc.timeouts.get(Timeouts::CONNECT))
            .map_err(|_| RES_CONNECT)?;
        rec.ops.connects += 1;
        let _ = s.set_nodelay(true);
        s.set_write_timeout(Some(send_timeout))
            .map_err(|_| RES_SOCKET)?;
        let mut framed = (msg.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(msg);
        s.write_all(&framed).map_err(|_| RES_SEND_SERVER)?;
        rec.out += framed.len() as u64;
        rec.ops.writes += 1;
        let deadline = Instant::now() + dns_timeout;
        let mut len = [0u8; 2];
        read_exact_by(&mut s, &mut len, deadline).map_err(|_| RES_NO_REPLY)?;
        // The length and the message: two reads.
        rec.ops.reads += 2;
        let len = usize::from(u16::from_be_bytes(len));
        if len > MAX_TCP_REPLY {
            return Err(RES_TCP_LONG);
        }
        let mut reply = vec![0u8; len];
        read_exact_by(&mut s, &mut reply, deadline).map_err(|_| RES_TCP_SHORT)?;
        rec.inb += len as u64 + 2;
        if len <= MIN_QUERY || reply[..2] != msg[..2] {
            return Err(RES_NO_REPLY);
        }
        reply
    } else {
        let any: IpAddr = if server.addr.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        };
        let s = UdpSocket::bind(SocketAddr::new(any, 0)).map_err(|_| RES_SOCKET)?;
        // Connected: only the server's datagrams are read.
        s.connect(server.addr).map_err(|_| RES_SOCKET)?;
        s.set_write_timeout(Some(send_timeout))
            .map_err(|_| RES_SOCKET)?;
        s.send(msg).map_err(|_| RES_SEND_SERVER)?;
        rec.out += msg.len() as u64;
        rec.ops.writes += 1;
        let deadline = Instant::now() + dns_timeout;
        let mut buf = vec![0u8; BUF];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RES_NO_REPLY);
            }
            s.set_read_timeout(Some(left)).map_err(|_| RES_SOCKET)?;
            let n = match s.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Err(RES_NO_REPLY),
            };
            rec.inb += n as u64;
            rec.ops.reads += 1;
            // Another query's late reply is not this one's.
            if n > MIN_QUERY && buf[..2] == msg[..2] {
                buf.truncate(n);
                break buf;
            }
        }
    };
    Ok(reply)
}

/// One query's log record and its slot in the service's count; written
/// (unless `nolog`) and released on drop.
struct QueryRecord {
    svc: Arc<Service>,
    from: SocketAddr,
    start: SystemTime,
    res: Res,
    user: Option<String>,
    nolog: bool,
    qtype: u16,
    host: Option<String>,
    /// The address answered with.
    addr: Option<IpAddr>,
    /// The server asked.
    remote: Option<SocketAddr>,
    out: u64,
    inb: u64,
    /// The server's datagrams each way (TrafficPlugin's `p` form).
    ops: crate::traffic::Ops,
}

impl QueryRecord {
    fn new(svc: Arc<Service>, from: SocketAddr) -> QueryRecord {
        svc.metrics.accepted();
        QueryRecord {
            svc,
            from,
            start: SystemTime::now(),
            res: Res::OK,
            user: None,
            nolog: false,
            qtype: 0,
            host: None,
            addr: None,
            remote: None,
            out: 0,
            inb: 0,
            ops: Default::default(),
        }
    }

    /// `%T`: "TYPE/NAME/ADDRESS", the type in 4 hex digits, the address
    /// only when the service answered with one.
    fn text(&self) -> String {
        let addr = self.addr.map(|a| a.to_string()).unwrap_or_default();
        format!(
            "{:04x}/{}/{addr}",
            self.qtype,
            self.host.as_deref().unwrap_or("")
        )
    }
}

impl Drop for QueryRecord {
    fn drop(&mut self) {
        if let Some(rules) = self.svc.traffic.as_deref().filter(|_| !self.nolog) {
            // TrafficPlugin: a query is a datagram record.
            let seen = crate::traffic::Seen {
                service: self.svc.def.log_name,
                port: self.remote.map(|a| a.port()),
                datagram: true,
                ops: self.ops,
            };
            (self.out, self.inb) = rules.apply(&seen, self.out, self.inb);
        }
        let svc = &self.svc;
        svc.metrics.ended();
        if !self.nolog {
            svc.metrics
                .record(self.res, self.out, self.inb, self.user.as_deref());
        }
        if let Some(sink) = svc.log.as_ref().filter(|_| !self.nolog) {
            let text = self.text();
            let rec = LogRecord {
                service: svc.def.log_name,
                listen_port: svc.port(),
                res: self.res.0,
                user: self.user.as_deref(),
                client: Some(self.from),
                local: listen_addr(svc),
                remote: self.remote,
                bytes_in: self.inb,
                bytes_out: self.out,
                text: &text,
                start: self.start,
                ..LogRecord::blank(svc.def.log_name, SystemTime::now())
            };
            crate::log::emit(sink, &svc.logformat, &rec);
        }
        let mut live = svc.live.lock().unwrap_or_else(|e| e.into_inner());
        *live = live.saturating_sub(1);
        crate::shutdown::session_ended();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::dns::tests::query;
    use simple_dns::rdata::RData;
    use simple_dns::{Packet, RCODE};

    fn ctx() -> Ctx {
        Ctx {
            fake: Fake::default(),
            simple: false,
            local: Some(Ipv4Addr::new(127, 0, 0, 1).into()),
        }
    }

    fn table(host: &str, v6: bool) -> Option<resolve::Record> {
        let ip: IpAddr = match (host, v6) {
            ("a.test", false) => "10.1.2.3".parse().unwrap(),
            ("a.test", true) => "fd00::1".parse().unwrap(),
            _ => return None,
        };
        Some(resolve::Record {
            ip,
            ttl: 300,
            server: None,
        })
    }

    /// The reply the service itself gives, if any.
    fn reply(msg: &[u8], ctx: &Ctx) -> Option<Vec<u8>> {
        let q = Question::parse(msg).ok()?;
        Some(match local_answer(&q, ctx, table) {
            Some(Local::Addr(r)) => q.addr_reply(r.ip, r.ttl),
            Some(Local::Ptr) => q.ptr_reply(),
            None => q.nxdomain_reply(),
        })
    }

    #[test]
    fn answers_a_and_aaaa_with_the_ttl() {
        let r = reply(&query("a.test", TYPE_A), &ctx()).unwrap();
        let p = Packet::parse(&r).unwrap();
        assert_eq!(p.id(), 0x1234);
        assert_eq!(p.rcode(), RCODE::NoError);
        assert_eq!(p.questions.len(), 1);
        assert!(p.additional_records.is_empty());
        let [a] = p.answers.as_slice() else { panic!() };
        assert_eq!(a.ttl, 300);
        assert!(
            matches!(&a.rdata, RData::A(x) if Ipv4Addr::from(x.address) == Ipv4Addr::new(10, 1, 2, 3))
        );
        let r = reply(&query("A.Test", TYPE_AAAA), &ctx());
        // Names are looked up as they came: the resolver lowercases them.
        assert!(Packet::parse(&r.unwrap()).unwrap().answers.is_empty());
        let r = reply(&query("a.test", TYPE_AAAA), &ctx()).unwrap();
        let p = Packet::parse(&r).unwrap();
        assert!(matches!(&p.answers[0].rdata, RData::AAAA(_)));
    }

    #[test]
    fn unknown_names_and_no_server_are_nxdomain() {
        let r = reply(&query("b.test", TYPE_A), &ctx()).unwrap();
        let p = Packet::parse(&r).unwrap();
        assert_eq!(p.rcode(), RCODE::NameError);
        assert!(p.answers.is_empty() && p.additional_records.is_empty());
    }

    #[test]
    fn fake_and_simple() {
        let mut c = ctx();
        c.fake.v4 = Some(Ipv4Addr::new(1, 2, 3, 4));
        let q = query("x.test", TYPE_A);
        let q = Question::parse(&q).unwrap();
        let Some(Local::Addr(r)) = local_answer(&q, &c, table) else {
            panic!()
        };
        assert_eq!((r.ip, r.ttl), (Ipv4Addr::new(1, 2, 3, 4).into(), 3600));
        // -s: A and AAAA go to the server, -F still answers.
        c.simple = true;
        let a = query("a.test", TYPE_AAAA);
        assert!(local_answer(&Question::parse(&a).unwrap(), &c, table).is_none());
        assert!(local_answer(&q, &c, table).is_some());
    }

    #[test]
    fn ptr_of_the_own_address_is_3proxy() {
        let r = reply(&query("1.0.0.127.in-addr.arpa", TYPE_PTR), &ctx()).unwrap();
        let p = Packet::parse(&r).unwrap();
        let [a] = p.answers.as_slice() else { panic!() };
        assert!(matches!(&a.rdata, RData::PTR(n) if n.0.to_string() == "3proxy"));
        let q = query("2.0.0.127.in-addr.arpa", TYPE_PTR);
        assert!(local_answer(&Question::parse(&q).unwrap(), &ctx(), table).is_none());
        assert_eq!(reverse_v4("4.3.2.1.x"), Some(Ipv4Addr::new(1, 2, 3, 4)));
        assert_eq!(reverse_v4("4.3.2"), None);
        assert_eq!(reverse_v4("4.3.2.x"), None);
        assert_eq!(reverse_v4("256.0.0.0"), Some(Ipv4Addr::new(0, 0, 1, 0)));
    }

    #[test]
    fn a_name_that_is_not_plain_is_not_looked_up() {
        // A compression pointer is a 192-byte label: not a name to ask.
        let mut m = vec![0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0];
        m.extend(std::iter::repeat_n(b'x', 192));
        m.extend_from_slice(&[0, 0, 1, 0, 1]);
        let q = Question::parse(&m).unwrap();
        assert!(local_answer(&q, &ctx(), |_, _| panic!("asked")).is_none());
    }

    #[test]
    fn no_datagram_panics() {
        // Every truncation of a few queries, and pseudo-random bytes.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut inputs: Vec<Vec<u8>> = Vec::new();
        for q in [
            query("a.test", TYPE_A),
            query("1.0.0.127.in-addr.arpa", TYPE_PTR),
            query("", TYPE_A),
        ] {
            for n in 0..=q.len() {
                inputs.push(q[..n].to_vec());
            }
        }
        for len in 0..600 {
            let mut m = Vec::with_capacity(len);
            for _ in 0..len {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                m.push(seed as u8);
            }
            if m.len() > 5 {
                m[4] = 0;
                m[5] = 1;
            }
            inputs.push(m);
        }
        let mut c = ctx();
        for m in &inputs {
            for simple in [false, true] {
                c.simple = simple;
                if let Some(r) = reply(m, &c) {
                    assert!(r.len() >= 12);
                }
            }
        }
        let reply = nxdomain(vec![0; 14]);
        assert_eq!(&reply[2..4], &[0x85, 0x83]);
    }

    #[test]
    fn fake_option_takes_addresses() {
        let opts = |v: &[&str]| ServiceOpts {
            other: v.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let f = fake(&opts(&["-F1.2.3.4", "-F::5", "-Tx"])).unwrap();
        assert_eq!(f.v4, Some(Ipv4Addr::new(1, 2, 3, 4)));
        assert_eq!(f.v6, Some("::5".parse().unwrap()));
        assert!(fake(&opts(&["-Fhost"])).is_err());
        assert!(fake(&opts(&["-F"])).is_err());
    }
}
