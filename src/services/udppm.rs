//! `udppm`: the UDP port mapper (3proxy's udppm.c, udppm(8)).
//!
//! The service thread receives every datagram on the listening socket. The
//! first datagram from a client address opens an association: a socket
//! connected to the destination, and a thread that passes the
//! destination's replies back to that client. Later datagrams from the
//! same client are sent on by the service thread itself, unless they have
//! to wait: when the association limits what the client sends
//! (`bandlimout`, `countout`, `countall`), or a reload is to be checked
//! first (`force`), the service thread hands them to the association's
//! thread through a local datagram socket pair (the association's queue)
//! and goes on with other clients. The association's thread sends them
//! when the limit allows, waiting in poll() with a timeout; replies held
//! back by `bandlimin` wait in the outgoing socket's receive buffer.
//!
//! An association ends after STRING_LONG seconds without a reply, with
//! `-s` after the first reply (one request, one answer, as DNS does), with
//! code 10 once it has used up a traffic quota, or with the refusal's code
//! when a reload's ACL no longer allows it; it is then logged like a TCP
//! session.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use nix::errno::Errno;
use nix::sys::socket::{recv, MsgFlags};

use crate::access::{self, Op, Recheck, Request};
use crate::limit::SessionLimits;
use crate::logformat::LogRecord;
use crate::net::{Stream, Target};
use crate::parent::{Hop, Kind};
use crate::proto::socks::{parse_udp_header, udp_header};
use crate::res::Res;
use crate::resolve::resolve;
use crate::service::Service;
use crate::timeouts::Timeouts;
use crate::udprelay::{self, Step};

use udprelay::DGRAM_MAX;

struct Assoc {
    /// Connected to the destination.
    sock: UdpSocket,
    /// The service thread's end of the queue to the association's thread;
    /// non-blocking: when the queue is full a datagram is dropped, as a
    /// full socket buffer would drop it.
    queue: UnixDatagram,
    /// Datagrams handed to the queue and not yet taken from it.
    queued: AtomicUsize,
    /// What the client sends has a bandwidth limit or a quota: all of it
    /// goes through the queue.
    shaped: bool,
    /// The reload generation the association was last checked against.
    checked: AtomicU64,
    /// Client to server bytes sent by the service thread (%O), and the
    /// datagrams that carried them.
    out: AtomicU64,
    sent: AtomicU64,
    /// Through a socks5 parent: the association made there.
    via: Option<Via>,
}

/// A UDP association at a socks5 parent (`chain::udp_associate`): `sock`
/// is connected to its relay, and every datagram carries a SOCKS header.
struct Via {
    /// The association at the parent lives as long as this connection.
    control: Stream,
    /// The header naming the destination, put in front of each datagram.
    header: Vec<u8>,
}

impl Assoc {
    /// Send a client datagram to the destination, or queue it for the
    /// association's thread. Err if sending it failed.
    fn forward(&self, d: &[u8]) -> Result<(), ()> {
        if !self.shaped
            && self.via.is_none()
            && self.queued.load(Ordering::Acquire) == 0
            && self.checked.load(Ordering::Acquire) == crate::running::generation()
        {
            self.sock.send(d).map_err(|_| ())?;
            self.out.fetch_add(d.len() as u64, Ordering::Relaxed);
            if !d.is_empty() {
                self.sent.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(());
        }
        // Counted before it is sent, so the count is never short of what
        // the queue holds.
        self.queued.fetch_add(1, Ordering::AcqRel);
        if self.queue.send(d).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(())
    }
}

type Table = Arc<Mutex<HashMap<SocketAddr, Arc<Assoc>>>>;

/// The service thread's body: runs until the service is stopped.
pub fn run(r: Arc<crate::running::Running>, listen: UdpSocket) {
    let first = r.current();
    if !first.opts.silent {
        crate::acceptor::svc_record(&first, "Accepting connections");
    }
    drop(first);
    // Wake up once a second to notice a stop even without traffic.
    let _ = listen.set_read_timeout(Some(Duration::from_secs(1)));
    let listen = Arc::new(listen);
    let table: Table = Arc::default();
    let mut buf = vec![0u8; DGRAM_MAX];
    let mut last_warn: Option<Instant> = None;
    while !r.stopped() {
        let (n, from) = match listen.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) => {
                if !r.stopped() {
                    log::warn!("udppm: recvfrom(): {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
        };
        let known = table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&from)
            .cloned();
        if let Some(a) = known {
            let _ = a.forward(&buf[..n]);
            continue;
        }
        // The generation first: a reload between the two reads makes the
        // association be checked again, never missed.
        let generation = crate::running::generation();
        let svc = r.current();
        if !crate::client::take_datagram_slot(&svc, &mut last_warn, "associations") {
            continue;
        }
        open(&svc, generation, &listen, &table, from, &buf[..n]);
    }
}

/// Open an association for `from` and send its first datagram; `svc` is
/// the settings of reload `generation` or a later one.
fn open(
    svc: &Arc<Service>,
    generation: u64,
    listen: &Arc<UdpSocket>,
    table: &Table,
    from: SocketAddr,
    first: &[u8],
) {
    let start = SystemTime::now();
    svc.metrics.accepted();
    let mut rec = Association {
        svc: svc.clone(),
        from,
        start,
        res: Res::OK,
        user: None,
        nolog: false,
        remote: None,
        ext: None,
        out: 0,
        inb: 0,
        ops: Default::default(),
        hops: 0,
    };
    let opened = match associate(svc, generation, from, first, &mut rec) {
        Ok(o) => o,
        Err(res) => {
            rec.res = res;
            return;
        }
    };
    // With -s every datagram is a session of its own: it is not entered in
    // the table, so a datagram arriving as the previous session ends is not
    // handed to a session that will never answer it.
    let single = matches!(svc.opts.s_option, Some(n) if n > 0);
    if !single {
        table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(from, opened.assoc.clone());
    }
    let (listen, table, svc2) = (listen.clone(), table.clone(), svc.clone());
    let spawned = std::thread::Builder::new()
        .name(format!("udppm:{}", svc.port()))
        .stack_size(svc.stack_size)
        .spawn(move || serve(opened, rec, &listen, &svc2, single, generation, &table));
    if let Err(e) = spawned {
        log::error!("udppm on {}: cannot start a thread: {e}", svc.listen);
    }
}

/// An association made and its first datagram sent, before its thread
/// takes it on.
struct Opened {
    assoc: Arc<Assoc>,
    /// The thread's end of the queue.
    rx: UnixDatagram,
    limits: Option<Arc<SessionLimits>>,
    recheck: Recheck,
}

/// Make the association for `from`: the destination, the ACL's grant,
/// the parents' association if they carry it, the socket and the queue;
/// then send `first`. `rec` takes what is learnt on the way. Err with the
/// code the association's record then carries.
fn associate(
    svc: &Arc<Service>,
    generation: u64,
    from: SocketAddr,
    first: &[u8],
    rec: &mut Association,
) -> Result<Opened, Res> {
    let dst = destination(svc)?;
    let req = request(svc, from, dst);
    // A refused datagram is dropped; its record carries the code.
    let grant = access::authorize(svc, &req)?;
    // `nolog`: the association ends without a record.
    rec.nolog = grant.nolog;
    rec.user = grant.user;
    let limits = grant.limits;
    let recheck = Recheck::new(svc, &req);
    // Parents: the association is made at the chain's last hop (a socks5
    // parent), whose relay then carries the datagrams.
    let want = crate::chain::Want {
        addr: Some(dst),
        client: Some(from),
        local: req.local,
        ..crate::chain::Want::default()
    };
    let parents: &[Hop] = if carries_udp(&grant.parents) {
        &grant.parents
    } else {
        &[]
    };
    let up = crate::chain::udp_associate(svc, parents, &want)?;
    let sock = match &up {
        Some(u) => connect(svc, u.relay, u.source),
        None => connect(svc, dst, None),
    }?;
    rec.remote = Some(dst);
    rec.ext = sock.local_addr().ok();
    let via = up.map(|u| {
        rec.hops = u.hops;
        Via {
            control: u.control,
            header: udp_header(dst),
        }
    });
    let (queue, rx) = queue_pair().map_err(|_| Res::SOCKET)?;
    let assoc = Arc::new(Assoc {
        sock,
        queue,
        queued: AtomicUsize::new(0),
        shaped: limits.as_ref().is_some_and(|l| l.shapes_dir(true)),
        checked: AtomicU64::new(generation),
        out: AtomicU64::new(0),
        sent: AtomicU64::new(0),
        via,
    });
    if assoc.forward(first).is_err() {
        return Err(Res::SERVER_ERR);
    }
    Ok(Opened {
        assoc,
        rx,
        limits,
        recheck,
    })
}

/// Where the service's datagrams go: its target, resolved.
fn destination(svc: &Service) -> Result<SocketAddr, Res> {
    match &svc.target {
        Some(Target::Fixed(a)) => Ok(*a),
        Some(Target::Name(h, p)) => resolve(h, *p, svc.family),
        _ => Err(Res::NOHOST),
    }
}

/// The ACL's question for an association of `from` with `dst`.
fn request(svc: &Service, from: SocketAddr, dst: SocketAddr) -> Request<'_> {
    Request {
        op: Some(Op::UdpAssoc),
        client: Some(from),
        local: match svc.listen {
            crate::net::Addr::Ip(a) => Some(a),
            _ => None,
        },
        host: match &svc.target {
            Some(Target::Name(h, _)) => Some(h.as_str()),
            _ => None,
        },
        addr: Some(dst.ip()),
        port: dst.port(),
        user: None,
        password: None,
        service: Some(svc.def.log_name),
        connlim_early: None,
        redirected: false,
    }
}

/// The queue from the service thread to an association's thread: both
/// ends non-blocking.
fn queue_pair() -> std::io::Result<(UnixDatagram, UnixDatagram)> {
    let (tx, rx) = UnixDatagram::pair()?;
    tx.set_nonblocking(true)?;
    rx.set_nonblocking(true)?;
    Ok((tx, rx))
}

/// An association's thread: relay until the association ends, leave the
/// table, and write the record (dropping `rec`).
fn serve(
    opened: Opened,
    mut rec: Association,
    listen: &UdpSocket,
    svc: &Service,
    single: bool,
    generation: u64,
    table: &Table,
) {
    let Opened {
        assoc,
        rx,
        limits,
        recheck,
    } = opened;
    let mut ends = Mapped {
        assoc: &assoc,
        rx: &rx,
        listen,
        to: rec.from,
    };
    let opts = udprelay::Opts {
        idle: svc.timeouts.get(Timeouts::STRING_LONG),
        idle_on_out: false,
        single,
        limits: limits.as_deref(),
        recheck: Some(&recheck),
        since: generation,
    };
    let mut n = udprelay::Counts::default();
    rec.res = udprelay::relay(&mut ends, &opts, &mut n);
    rec.inb = n.inb;
    rec.out = n.out;
    if !single {
        let mut t = table.lock().unwrap_or_else(|e| e.into_inner());
        // A new association of the same client may have taken the
        // slot already.
        if t.get(&rec.from).is_some_and(|a| Arc::ptr_eq(a, &assoc)) {
            t.remove(&rec.from);
        }
    }
    rec.out += assoc.out.load(Ordering::Relaxed);
    rec.ops = crate::traffic::Ops {
        reads: n.reads,
        writes: n.writes + assoc.sent.load(Ordering::Relaxed),
        connects: 0,
    };
    rec.correct(limits.as_deref());
    // The counters take the traffic before the record is written,
    // so a client that sees the record finds them up to date.
    drop(limits);
    drop(rec);
}

/// An association's thread's half of the relay (`crate::udprelay`).
struct Mapped<'a> {
    assoc: &'a Assoc,
    /// The thread's end of the queue.
    rx: &'a UnixDatagram,
    listen: &'a UdpSocket,
    /// The client.
    to: SocketAddr,
}

impl udprelay::Assoc for Mapped<'_> {
    fn client_fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }

    fn dest_fd(&self) -> BorrowedFd<'_> {
        self.assoc.sock.as_fd()
    }

    fn control_fd(&self, i: usize) -> Option<BorrowedFd<'_>> {
        match (i, &self.assoc.via) {
            (0, Some(v)) => Some(v.control.as_fd()),
            _ => None,
        }
    }

    fn controlled(&mut self, _i: usize) -> Res {
        // The parent ended the association.
        Res::PARENT_NO_UDP
    }

    fn outbound(&mut self, buf: &mut [u8]) -> Step {
        let a = self.assoc;
        let n = match self.rx.recv(buf) {
            Ok(n) => n,
            // Counted, not yet in the queue: poll() waits for it.
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Step::Empty,
            Err(e) if e.kind() == ErrorKind::Interrupted => return Step::Stray,
            Err(_) => return Step::End(Res::POLL),
        };
        let sent = match &a.via {
            // A parent's relay takes the datagram behind a SOCKS header.
            Some(v) => {
                let mut d = v.header.clone();
                d.extend_from_slice(&buf[..n]);
                a.sock.send(&d).is_ok()
            }
            None => a.sock.send(&buf[..n]).is_ok(),
        };
        a.queued.fetch_sub(1, Ordering::AcqRel);
        Step::Moved(if sent { n } else { 0 })
    }

    fn inbound(&mut self, buf: &mut [u8]) -> Step {
        let room = &mut buf[udprelay::HEADROOM..];
        let n = match recv(self.assoc.sock.as_raw_fd(), room, MsgFlags::MSG_DONTWAIT) {
            Ok(n) => n,
            Err(Errno::EAGAIN) => return Step::Empty,
            // ECONNREFUSED: the destination port is closed (ICMP). The
            // association stays until idle, as the client may retry.
            Err(Errno::EINTR | Errno::ECONNREFUSED) => return Step::Stray,
            Err(_) => return Step::End(Res::SERVER_ERR),
        };
        let payload = match &self.assoc.via {
            // From the parent's relay: its header comes off.
            Some(_) => match parse_udp_header(&room[..n]) {
                Ok((_, off)) => &room[off..n],
                Err(_) => return Step::Stray,
            },
            None => &room[..n],
        };
        if self.listen.send_to(payload, self.to).is_err() {
            return Step::End(Res::CLIENT_ERR);
        }
        Step::Moved(payload.len())
    }

    fn rechecked(&mut self, generation: u64) {
        self.assoc.checked.store(generation, Ordering::Release);
    }
}

/// Whether udppm takes an entry's parents: when they can carry UDP (a
/// socks5 parent, and none that ends a chain with a byte stream or
/// redirects locally). Other parents are passed over, as 3proxy's udppm
/// passes over every parent, so a cfg written for it means what it did.
fn carries_udp(parents: &[Hop]) -> bool {
    parents
        .iter()
        .any(|h| matches!(h.kind, Kind::Socks5 | Kind::Socks5Plus))
        && !parents
            .iter()
            .any(|h| matches!(h.kind, Kind::Tcp | Kind::Http) || h.is_local())
}

/// A UDP socket connected to `dst`, sent from `source` (an `extip` hop's
/// address, when it is of `dst`'s family) or else from `external`.
fn connect(svc: &Service, dst: SocketAddr, source: Option<IpAddr>) -> Result<UdpSocket, Res> {
    let ip = match (dst, source) {
        (SocketAddr::V4(_), Some(ip @ IpAddr::V4(_)))
        | (SocketAddr::V6(_), Some(ip @ IpAddr::V6(_))) => ip,
        (SocketAddr::V4(_), _) => svc.dialer.ext4.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        (SocketAddr::V6(_), _) => svc.dialer.ext6.unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
    };
    let src = SocketAddr::new(ip, 0);
    let s = crate::net::in_netns(svc.dialer.netns.as_deref(), || UdpSocket::bind(src))
        .map_err(|_| Res::BIND)?;
    if let Some(dev) = &svc.dialer.device {
        socket2::SockRef::from(&s)
            .bind_device(Some(dev.as_bytes()))
            .map_err(|_| Res::BIND)?;
    }
    s.connect(dst).map_err(|_| Res::CONNECT)?;
    Ok(s)
}

/// One association's log record and its slot in the service's count;
/// written (unless `nolog`) and released on drop.
struct Association {
    svc: Arc<Service>,
    from: SocketAddr,
    start: SystemTime,
    res: Res,
    /// From the auth cache or `auth dnsname`.
    user: Option<String>,
    nolog: bool,
    remote: Option<SocketAddr>,
    ext: Option<SocketAddr>,
    out: u64,
    inb: u64,
    /// Datagrams each way (TrafficPlugin's `p` form).
    ops: crate::traffic::Ops,
    /// Parents taken (`%h`).
    hops: u32,
}

impl Association {
    /// TrafficPlugin: the bytes the record says, as the service's rules
    /// correct them; the counters of `limits` take the difference.
    fn correct(&mut self, limits: Option<&SessionLimits>) {
        let Some(rules) = self.svc.traffic.as_deref().filter(|_| !self.nolog) else {
            return;
        };
        let seen = crate::traffic::Seen {
            service: self.svc.def.log_name,
            port: self.remote.map(|a| a.port()),
            datagram: true,
            ops: self.ops,
        };
        let (out, inb) = rules.apply(&seen, self.out, self.inb);
        if let Some(l) = limits {
            l.recount((self.inb, self.out), (inb, out));
        }
        (self.out, self.inb) = (out, inb);
    }
}

impl Drop for Association {
    fn drop(&mut self) {
        let svc = &self.svc;
        svc.metrics.ended();
        if !self.nolog {
            svc.metrics
                .record(self.res, self.out, self.inb, self.user.as_deref());
        }
        if let Some(sink) = svc.log.as_ref().filter(|_| !self.nolog) {
            let host = svc.target.as_ref().map(|t| t.host()).unwrap_or_default();
            let listen = match svc.listen {
                crate::net::Addr::Ip(a) => Some(a),
                _ => None,
            };
            let rec = LogRecord {
                service: svc.def.log_name,
                listen_port: svc.port(),
                res: self.res.0,
                user: self.user.as_deref(),
                client: Some(self.from),
                local: listen,
                ext: self.ext,
                remote: self.remote,
                req: self.remote,
                // The target as written is %n too (3proxy's udppm).
                req_host: Some(host.as_str()).filter(|h| !h.is_empty()),
                bytes_in: self.inb,
                bytes_out: self.out,
                hops: self.hops,
                text: &host,
                start: self.start,
                now: SystemTime::now(),
            };
            crate::log::emit(sink, &svc.logformat, &rec);
        }
        let mut live = svc.live.lock().unwrap_or_else(|e| e.into_inner());
        *live = live.saturating_sub(1);
        crate::shutdown::session_ended();
    }
}
