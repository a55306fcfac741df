//! `udppm`: the UDP port mapper (3proxy's udppm.c, udppm(8)).
//!
//! The service thread receives every datagram on the listening socket. The
//! first datagram from a client address opens an association: a socket
//! connected to the destination, and a thread that waits for the
//! destination's replies and sends them back to that client. Later
//! datagrams from the same client are forwarded by the service thread
//! directly. An association ends after STRING_LONG seconds without
//! traffic, or, with `-s`, after the first reply (one request, one answer,
//! as DNS does), and is then logged like a TCP session.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::conf::Timeouts;
use crate::logformat::LogRecord;
use crate::net::{resolve, Target};
use crate::res::Res;
use crate::services::Service;

/// Largest datagram relayed.
const DGRAM_MAX: usize = 65536;

struct Assoc {
    /// Connected to the destination.
    sock: UdpSocket,
    /// Client to server bytes (%O).
    out: AtomicU64,
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
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => {
                if !r.stopped() {
                    log::warn!("udppm: recvfrom(): {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
        };
        let svc = r.current();
        let known = table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&from)
            .cloned();
        if let Some(a) = known {
            if a.sock.send(&buf[..n]).is_ok() {
                a.out.fetch_add(n as u64, Ordering::Relaxed);
            }
            continue;
        }
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
        open(&svc, &listen, &table, from, &buf[..n]);
    }
}

/// Open an association for `from` and send its first datagram.
fn open(
    svc: &Arc<Service>,
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
    let req = crate::access::Request {
        op: Some(crate::access::Op::UdpAssoc),
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
    };
    // A refused datagram is dropped; its record carries the code.
    let grant = match crate::access::authorize(svc, &req) {
        Ok(g) => g,
        Err(res) => {
            rec.res = res;
            return;
        }
    };
    let sock = match connect(svc, dst) {
        Ok(s) => s,
        Err(res) => {
            rec.res = res;
            return;
        }
    };
    rec.remote = Some(dst);
    rec.ext = sock.local_addr().ok();
    if sock.send(first).is_err() {
        rec.res = Res::SERVER_ERR;
        return;
    }
    let assoc = Arc::new(Assoc {
        sock,
        out: AtomicU64::new(first.len() as u64),
    });
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
            replies(&mut rec, &assoc, &listen);
            if !single {
                table
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&rec.from);
            }
            rec.count_out(&assoc);
            if let Some(l) = &grant.limits {
                l.add(rec.inb, rec.out);
            }
        });
    if let Err(e) = spawned {
        log::error!("udppm on {}: cannot start a thread: {e}", svc.listen);
    }
}

/// Relay the destination's datagrams back to the client until idle.
fn replies(rec: &mut Session, assoc: &Assoc, listen: &UdpSocket) {
    let svc = rec.svc.clone();
    let single = matches!(svc.opts.s_option, Some(n) if n > 0);
    let _ = assoc
        .sock
        .set_read_timeout(Some(svc.timeouts.get(Timeouts::STRING_LONG)));
    let mut buf = vec![0u8; DGRAM_MAX];
    loop {
        match assoc.sock.recv(&mut buf) {
            Ok(n) => {
                if listen.send_to(&buf[..n], rec.from).is_err() {
                    rec.res = Res::CLIENT_ERR;
                    return;
                }
                rec.inb += n as u64;
                if single {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                rec.res = Res::IDLE;
                return;
            }
            // ECONNREFUSED: the destination port is closed (ICMP). The
            // association stays until idle, as the client may retry.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => continue,
            Err(_) => {
                rec.res = Res::SERVER_ERR;
                return;
            }
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
/// written and released on drop.
struct Session {
    svc: Arc<Service>,
    from: SocketAddr,
    start: SystemTime,
    res: Res,
    remote: Option<SocketAddr>,
    ext: Option<SocketAddr>,
    out: u64,
    inb: u64,
}

impl Session {
    fn count_out(&mut self, a: &Assoc) {
        self.out = a.out.load(Ordering::Relaxed);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let svc = &self.svc;
        if let Some(sink) = &svc.log {
            let host = svc.target.as_ref().map(|t| t.host()).unwrap_or_default();
            let listen = match svc.listen {
                crate::net::Addr::Ip(a) => Some(a),
                _ => None,
            };
            let rec = LogRecord {
                service: svc.def.log_name,
                listen_port: svc.port(),
                res: self.res.0,
                user: None,
                client: Some(self.from),
                local: listen,
                ext: self.ext,
                remote: self.remote,
                req: self.remote,
                req_host: None,
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
