//! `radiusdae` (threeproxy's own): a Dynamic Authorization listener
//! (RFC 5176) on one UDP address. A Disconnect-Request from an allowed
//! source, signed with the listener's own secret, ends the live sessions
//! it names (by User-Name, Acct-Session-Id, or both) through the
//! live-session registry, and is answered with a Disconnect-ACK, or a
//! Disconnect-NAK with an Error-Cause. A CoA-Request is answered with a
//! CoA-NAK: a live session's bandwidth cannot be changed (the `bandlim`
//! buckets a session draws from are fixed when it starts).
//!
//! One thread serves the listener; a reload that keeps the address keeps
//! the socket and the thread and only swaps the secret and the sources;
//! one that changes it binds the new socket while loading (so a cfg error
//! names the line) and the old thread stops within [`POLL`].
//!
//! A datagram from a source that is not allowed, or whose authenticators
//! do not check out, is dropped without an answer (RFC 5176 3.5), with a
//! warning now and then.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::proto::radius::{self as wire, attr, error_cause, Builder, DaeRequest};

/// RFC 5176's port.
pub const DEFAULT_PORT: u16 = 3799;
/// How often the listener's thread looks whether it was replaced.
const POLL: Duration = Duration::from_secs(1);
/// How long a Disconnect-ACK waits for the ended sessions to be gone
/// (their records written, their Stops queued).
const END_WAIT: Duration = Duration::from_secs(3);

/// A source allowed to send requests: an address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    pub net: IpAddr,
    pub bits: u8,
}

impl Source {
    fn admits(&self, ip: IpAddr) -> bool {
        let (a, b, width) = match (self.net.to_canonical(), ip.to_canonical()) {
            (IpAddr::V4(n), IpAddr::V4(i)) => {
                (u128::from(u32::from(n)), u128::from(u32::from(i)), 32)
            }
            (IpAddr::V6(n), IpAddr::V6(i)) => (u128::from(n), u128::from(i), 128),
            _ => return false,
        };
        let bits = u32::from(self.bits.min(width as u8));
        if bits == 0 {
            return true;
        }
        let shift = width - bits;
        (a >> shift) == (b >> shift)
    }
}

/// The listener's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conf {
    pub secret: Vec<u8>,
    /// Empty: loopback only.
    pub sources: Vec<Source>,
}

impl Conf {
    fn admits(&self, ip: IpAddr) -> bool {
        if self.sources.is_empty() {
            return ip.to_canonical().is_loopback();
        }
        self.sources.iter().any(|s| s.admits(ip))
    }
}

/// A `radiusdae` line, bound (unless the running listener has its
/// address already, or the cfg is only checked), waiting for the load to
/// finish.
#[derive(Debug)]
pub struct Pending {
    pub addr: SocketAddr,
    socket: Option<UdpSocket>,
    pub conf: Conf,
}

struct Running {
    addr: SocketAddr,
    conf: Arc<Mutex<Arc<Conf>>>,
    stop: Arc<AtomicBool>,
}

static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a `radiusdae` line asks for; binds its socket now unless the
/// running listener already listens there or `bind` is false (`-t`).
pub fn prepare(addr: SocketAddr, conf: Conf, bind: bool) -> Result<Pending, String> {
    let running = lock(&RUNNING).as_ref().map(|r| r.addr) == Some(addr);
    let socket = if bind && !running {
        Some(UdpSocket::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?)
    } else {
        None
    };
    Ok(Pending { addr, socket, conf })
}

/// The loaded cfg's listener (None: no `radiusdae` line): the running one
/// takes its settings, or is replaced by it, or stops.
pub fn install(p: Option<Pending>) {
    let mut r = lock(&RUNNING);
    match p {
        Some(Pending {
            addr,
            socket: None,
            conf,
        }) if r.as_ref().is_some_and(|r| r.addr == addr) => {
            if let Some(r) = r.as_ref() {
                *lock(&r.conf) = Arc::new(conf);
            }
        }
        Some(Pending {
            addr,
            socket: Some(sock),
            conf,
        }) => {
            if let Some(old) = r.take() {
                old.stop.store(true, Ordering::Relaxed);
            }
            let conf = Arc::new(Mutex::new(Arc::new(conf)));
            let stop = Arc::new(AtomicBool::new(false));
            let (c, s) = (conf.clone(), stop.clone());
            let spawned = std::thread::Builder::new()
                .name("radiusdae".into())
                .stack_size(256 << 10)
                .spawn(move || serve(sock, c, s));
            match spawned {
                Ok(_) => {
                    log::info!("radiusdae: listening on {addr}");
                    *r = Some(Running { addr, conf, stop });
                }
                Err(e) => log::error!("radiusdae: cannot start the listener thread: {e}"),
            }
        }
        // Not bound (`-t`), or no line: nothing listens.
        _ => {
            if let Some(old) = r.take() {
                old.stop.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// A warning, at most once per power of two of its count (a flood of
/// forged datagrams gives a few lines, not one each).
fn warn_sometimes(n: &AtomicU64, msg: impl FnOnce() -> String) {
    let k = n.fetch_add(1, Ordering::Relaxed) + 1;
    if k.is_power_of_two() {
        log::warn!("radiusdae: {} ({k} so far)", msg());
    }
}

fn serve(sock: UdpSocket, conf: Arc<Mutex<Arc<Conf>>>, stop: Arc<AtomicBool>) {
    static REFUSED: AtomicU64 = AtomicU64::new(0);
    static BAD: AtomicU64 = AtomicU64::new(0);
    let _ = sock.set_read_timeout(Some(POLL));
    let mut buf = vec![0u8; wire::MAX_PACKET];
    while !stop.load(Ordering::Relaxed) {
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(x) => x,
            Err(_) => continue,
        };
        let c = lock(&conf).clone();
        if !c.admits(from.ip()) {
            warn_sometimes(&REFUSED, || {
                format!("dropped a request from {from}, not an allowed source")
            });
            continue;
        }
        let req = match wire::parse_dae(&buf[..n], &c.secret) {
            Ok(r) => r,
            Err(why) => {
                let why = match why {
                    wire::Fault::Authenticator => {
                        "bad Request Authenticator (wrong secret?)".to_string()
                    }
                    w => w.to_string(),
                };
                warn_sometimes(&BAD, || format!("dropped a request from {from}: {why}"));
                continue;
            }
        };
        let (code, cause) = act(&req, from);
        let mut b = Builder::new(code, req.id, req.authenticator);
        if let Some(cause) = cause {
            b.add_u32(attr::ERROR_CAUSE, cause);
        }
        let _ = sock.send_to(&b.finish_response(&c.secret), from);
    }
}

/// Do what a checked request asks: the answer's code and Error-Cause.
fn act(req: &DaeRequest, from: SocketAddr) -> (u8, Option<u32>) {
    let disconnect = req.code == wire::DISCONNECT_REQUEST;
    let nak = if disconnect {
        wire::DISCONNECT_NAK
    } else {
        wire::COA_NAK
    };
    if req.user.is_none() && req.session_id.is_none() {
        return (nak, Some(error_cause::MISSING_ATTRIBUTE));
    }
    let user = req.user.as_deref();
    let sid = req.session_id.as_deref();
    let mine = |i: &crate::live::Info, tag: Option<&crate::live::Tag>| {
        user.is_none_or(|u| i.user.as_deref() == Some(u))
            && sid.is_none_or(|s| {
                tag.and_then(|t| t.downcast_ref::<crate::radius::Track>())
                    .is_some_and(|t| t.session_id.as_str() == s)
            })
    };
    // Quoted and escaped: the names come from the network.
    let what = || match (user, sid) {
        (Some(u), Some(s)) => format!("user {u:?}, session {s:?}"),
        (Some(u), None) => format!("user {u:?}"),
        (None, s) => format!("session {:?}", s.unwrap_or("")),
    };
    if !disconnect {
        // Only the answer differs when some session matches.
        let any = !crate::live::find_if(mine).is_empty();
        if !any {
            return (nak, Some(error_cause::SESSION_CONTEXT_NOT_FOUND));
        }
        log::info!(
            "radiusdae: CoA-Request from {from} for {}: not supported (CoA-NAK)",
            what()
        );
        return (nak, Some(error_cause::UNSUPPORTED_EXTENSION));
    }
    let ended = crate::live::end_if(mine);
    log::info!(
        "radiusdae: Disconnect-Request from {from} for {}: {} session(s) ended",
        what(),
        ended.len()
    );
    if ended.is_empty() {
        return (nak, Some(error_cause::SESSION_CONTEXT_NOT_FOUND));
    }
    crate::live::wait_gone(&ended, END_WAIT);
    (wire::DISCONNECT_ACK, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources() {
        let s = |n: &str, bits| Source {
            net: n.parse().unwrap(),
            bits,
        };
        let ip = |a: &str| a.parse::<IpAddr>().unwrap();
        assert!(s("10.1.0.0", 16).admits(ip("10.1.200.3")));
        assert!(!s("10.1.0.0", 16).admits(ip("10.2.0.1")));
        assert!(s("10.1.2.3", 32).admits(ip("::ffff:10.1.2.3")));
        assert!(!s("10.1.2.3", 32).admits(ip("::1")));
        assert!(s("fd00::", 8).admits(ip("fd12::1")));
        let lo = Conf {
            secret: vec![],
            sources: vec![],
        };
        assert!(lo.admits(ip("127.0.0.5")) && lo.admits(ip("::1")));
        assert!(!lo.admits(ip("192.0.2.1")));
    }
}
