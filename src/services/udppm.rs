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
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recv, MsgFlags};

use crate::access::{self, Op, Recheck, Request};
use crate::limit::{Permit, Session as Limits};
use crate::logformat::LogRecord;
use crate::net::{resolve, Target};
use crate::res::Res;
use crate::service::Service;
use crate::timeouts::Timeouts;

/// Largest datagram relayed.
const DGRAM_MAX: usize = 65536;

/// Most datagrams an association's thread moves one way before it looks
/// at the other way.
const BATCH: usize = 64;

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
    /// Client to server bytes (%O).
    out: AtomicU64,
}

impl Assoc {
    /// Send a client datagram to the destination, or queue it for the
    /// association's thread. Err if sending it failed.
    fn forward(&self, d: &[u8]) -> Result<(), ()> {
        if !self.shaped
            && self.queued.load(Ordering::Acquire) == 0
            && self.checked.load(Ordering::Acquire) == crate::running::generation()
        {
            self.sock.send(d).map_err(|_| ())?;
            self.out.fetch_add(d.len() as u64, Ordering::Relaxed);
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
        {
            let mut live = svc.live.lock().unwrap_or_else(|e| e.into_inner());
            if *live >= svc.maxconn {
                // A datagram cannot wait in a backlog: it is dropped.
                if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                    log::warn!(
                        "udppm on {}: too many associations ({}), datagram dropped",
                        svc.listen,
                        *live
                    );
                    last_warn = Some(Instant::now());
                }
                continue;
            }
            *live += 1;
            crate::shutdown::session_started();
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
    let mut rec = Session {
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
    };
    let dst = match &svc.target {
        Some(Target::Fixed(a)) => Ok(*a),
        Some(Target::Name(h, p)) => resolve(h, *p, svc.family),
        _ => Err(Res::NOHOST),
    };
    let dst = match dst {
        Ok(d) => d,
        Err(res) => {
            rec.res = res;
            return;
        }
    };
    let req = Request {
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
        redirected: false,
    };
    // A refused datagram is dropped; its record carries the code.
    let grant = match access::authorize(svc, &req) {
        Ok(g) => g,
        Err(res) => {
            rec.res = res;
            return;
        }
    };
    // `nolog`: the association ends without a record.
    rec.nolog = grant.nolog;
    rec.user = grant.user;
    let limits = grant.limits;
    let recheck = Recheck::new(svc, &req);
    let sock = match connect(svc, dst) {
        Ok(s) => s,
        Err(res) => {
            rec.res = res;
            return;
        }
    };
    rec.remote = Some(dst);
    rec.ext = sock.local_addr().ok();
    let pair = UnixDatagram::pair().and_then(|(tx, rx)| {
        tx.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        Ok((tx, rx))
    });
    let Ok((queue, rx)) = pair else {
        rec.res = Res::SOCKET;
        return;
    };
    let assoc = Arc::new(Assoc {
        sock,
        queue,
        queued: AtomicUsize::new(0),
        shaped: limits.as_ref().is_some_and(|l| l.shapes_dir(true)),
        checked: AtomicU64::new(generation),
        out: AtomicU64::new(0),
    });
    if assoc.forward(first).is_err() {
        rec.res = Res::SERVER_ERR;
        return;
    }
    // With -s every datagram is a session of its own: it is not entered in
    // the table, so a datagram arriving as the previous session ends is not
    // handed to a session that will never answer it.
    let single = matches!(svc.opts.s_option, Some(n) if n > 0);
    if !single {
        table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(from, assoc.clone());
    }
    let (listen, table) = (listen.clone(), table.clone());
    let spawned = std::thread::Builder::new()
        .name(format!("udppm:{}", svc.port()))
        .stack_size(svc.stack_size)
        .spawn(move || {
            let ends = Ends {
                assoc: &assoc,
                rx: &rx,
                listen: &listen,
                limits: limits.as_deref(),
                recheck: &recheck,
            };
            rec.res = relay(&mut rec, &ends);
            if !single {
                let mut t = table.lock().unwrap_or_else(|e| e.into_inner());
                // A new association of the same client may have taken the
                // slot already.
                if t.get(&rec.from).is_some_and(|a| Arc::ptr_eq(a, &assoc)) {
                    t.remove(&rec.from);
                }
            }
            rec.out = assoc.out.load(Ordering::Relaxed);
            // The counters take the traffic before the record is written,
            // so a client that sees the record finds them up to date.
            drop(limits);
            drop(rec);
        });
    if let Err(e) = spawned {
        log::error!("udppm on {}: cannot start a thread: {e}", svc.listen);
    }
}

/// What an association's thread works with.
struct Ends<'a> {
    assoc: &'a Assoc,
    /// The thread's end of the queue.
    rx: &'a UnixDatagram,
    listen: &'a UdpSocket,
    limits: Option<&'a Limits>,
    recheck: &'a Recheck,
}

/// What the limits allow in one direction now.
fn permit(limits: Option<&Limits>, out: bool, now: Instant) -> Permit {
    limits.map_or(Permit::Go(usize::MAX), |l| l.permit(out, now))
}

/// The association's thread: queued client datagrams to the destination,
/// the destination's replies to the client, until the association ends;
/// returns its result code.
fn relay(rec: &mut Session, e: &Ends<'_>) -> Res {
    let a = e.assoc;
    let svc = rec.svc.clone();
    let single = matches!(svc.opts.s_option, Some(n) if n > 0);
    let idle = svc.timeouts.get(Timeouts::STRING_LONG);
    let shaped_in = e.limits.is_some_and(|l| l.shapes_dir(false));
    let dst = a.sock.as_raw_fd();
    let mut buf = vec![0u8; DGRAM_MAX];
    let mut deadline = Instant::now() + idle;
    let mut generation = a.checked.load(Ordering::Acquire);
    // Until when a limit holds each direction back.
    let mut out_wait: Option<Instant> = None;
    let mut in_wait: Option<Instant> = None;
    // The destination socket may have a datagram (or an error) to read.
    let mut dst_ready = true;
    loop {
        // `force`: after a reload, check the association again.
        let g = crate::running::generation();
        if g != generation {
            generation = g;
            if let Err(res) = crate::running::recheck(e.recheck) {
                return res;
            }
            a.checked.store(g, Ordering::Release);
        }
        let now = Instant::now();
        let mut busy = false;

        // Client datagrams waiting in the queue.
        out_wait = out_wait.filter(|t| *t > now);
        let mut moved = 0;
        while out_wait.is_none() && a.queued.load(Ordering::Acquire) > 0 {
            if moved == BATCH {
                busy = true;
                break;
            }
            match permit(e.limits, true, now) {
                Permit::Go(_) => {}
                Permit::Wait(t) => {
                    out_wait = Some(t);
                    break;
                }
                Permit::Stop => return Res::QUOTA,
            }
            let n = match e.rx.recv(&mut buf) {
                Ok(n) => n,
                // Counted, not yet in the queue: poll() waits for it.
                Err(err) if err.kind() == ErrorKind::WouldBlock => break,
                Err(err) if err.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return Res::POLL,
            };
            moved += 1;
            if a.sock.send(&buf[..n]).is_ok() {
                a.out.fetch_add(n as u64, Ordering::Relaxed);
                if let Some(l) = e.limits {
                    l.used(true, n, now);
                }
            }
            a.queued.fetch_sub(1, Ordering::AcqRel);
            // The datagram that uses up the quota is the last one.
            if permit(e.limits, true, now) == Permit::Stop {
                return Res::QUOTA;
            }
        }

        // Replies from the destination.
        in_wait = in_wait.filter(|t| *t > now);
        let mut moved = 0;
        while dst_ready && in_wait.is_none() {
            if moved == BATCH {
                busy = true;
                break;
            }
            if shaped_in {
                // Ask the limits only for a datagram that is there.
                let mut probe = [0u8; 1];
                match recv(dst, &mut probe, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
                    Ok(_) => {}
                    Err(Errno::EAGAIN) => {
                        dst_ready = false;
                        break;
                    }
                    Err(Errno::EINTR | Errno::ECONNREFUSED) => continue,
                    Err(_) => return Res::SERVER_ERR,
                }
                match permit(e.limits, false, now) {
                    Permit::Go(_) => {}
                    Permit::Wait(t) => {
                        in_wait = Some(t);
                        break;
                    }
                    Permit::Stop => return Res::QUOTA,
                }
            }
            let n = match recv(dst, &mut buf, MsgFlags::MSG_DONTWAIT) {
                Ok(n) => n,
                Err(Errno::EAGAIN) => {
                    dst_ready = false;
                    break;
                }
                // ECONNREFUSED: the destination port is closed (ICMP). The
                // association stays until idle, as the client may retry.
                Err(Errno::EINTR | Errno::ECONNREFUSED) => continue,
                Err(_) => return Res::SERVER_ERR,
            };
            moved += 1;
            deadline = Instant::now() + idle;
            if e.listen.send_to(&buf[..n], rec.from).is_err() {
                return Res::CLIENT_ERR;
            }
            rec.inb += n as u64;
            if let Some(l) = e.limits {
                l.used(false, n, now);
            }
            if single {
                return Res::OK;
            }
            if permit(e.limits, false, now) == Permit::Stop {
                return Res::QUOTA;
            }
        }
        if busy {
            continue;
        }

        // A reply held back by a limit is waiting: the association is not
        // idle.
        let now = Instant::now();
        if in_wait.is_none() && now >= deadline {
            return Res::IDLE;
        }
        let wake = [in_wait.is_none().then_some(deadline), out_wait, in_wait]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(deadline);
        // Rounded up: a wait shorter than a millisecond is not a busy loop.
        let ms = wake
            .saturating_duration_since(now)
            .as_nanos()
            .div_ceil(1_000_000);
        let timeout =
            PollTimeout::try_from(ms.min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX);
        let rx_ev = if out_wait.is_none() {
            PollFlags::POLLIN
        } else {
            PollFlags::empty()
        };
        let dst_ev = if in_wait.is_none() && !dst_ready {
            PollFlags::POLLIN
        } else {
            PollFlags::empty()
        };
        // Only descriptors with something to wait for are polled: POLLERR
        // and POLLHUP come even for no events and would make this spin.
        let mut pair = [
            PollFd::new(e.rx.as_fd(), rx_ev),
            PollFd::new(a.sock.as_fd(), dst_ev),
        ];
        let fds: &mut [PollFd<'_>] = match (rx_ev.is_empty(), dst_ev.is_empty()) {
            (false, false) => &mut pair[..],
            (false, true) => &mut pair[..1],
            (true, false) => &mut pair[1..],
            (true, true) => &mut [],
        };
        match poll(fds, timeout) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(_) => return Res::POLL,
        }
        if !dst_ev.is_empty() {
            let r = fds[fds.len() - 1].revents().unwrap_or(PollFlags::empty());
            dst_ready |= !r.is_empty();
        }
    }
}

fn connect(svc: &Service, dst: SocketAddr) -> Result<UdpSocket, Res> {
    let src = match dst {
        SocketAddr::V4(_) => SocketAddr::new(
            svc.dialer.ext4.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            0,
        ),
        SocketAddr::V6(_) => SocketAddr::new(
            svc.dialer.ext6.unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
            0,
        ),
    };
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
struct Session {
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
}

impl Drop for Session {
    fn drop(&mut self) {
        let svc = &self.svc;
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
                hops: 0,
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
