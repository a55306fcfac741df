//! The `radius` line: its servers, asked in order, those that failed to
//! answer held down for a while; the socket to one; warnings about them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Most servers on a `radius` line (3proxy's MAXRADIUS).
pub const MAX_SERVERS: usize = 5;
/// Longest secret kept; 3proxy cuts a longer one here.
pub const MAX_SECRET: usize = 63;

/// One server of the `radius` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Where Access-Requests go (port 1812 unless given).
    pub auth: SocketAddr,
    /// Where Accounting-Requests go: the same address, the next port
    /// (3proxy's rule).
    pub acct: SocketAddr,
    /// `/LOCAL`: the address to send from.
    pub local: Option<IpAddr>,
}

/// After a server failed to answer, it is asked after the others for
/// this long (it is still asked when they fail too).
pub const HOLD_DOWN: Duration = Duration::from_secs(30);

/// The `radius` line: the shared secret and the servers, in order.
#[derive(Debug)]
pub struct Conf {
    pub secret: Vec<u8>,
    pub servers: Vec<Server>,
    /// How long each server is waited for (`timeouts` slot 1).
    pub wait: Duration,
    /// `radiusinterim`: how often a live `log radius` session gets an
    /// Interim-Update; None (the default, as in 3proxy) for never.
    pub interim: Option<Duration>,
    /// Per server, authentication and accounting: until when (ms of
    /// [`clock_ms`]) it counts as down after it failed; 0 when it is up.
    down: Vec<[AtomicU64; 2]>,
}

pub(super) const AUTH: usize = 0;
pub(super) const ACCT: usize = 1;

/// Milliseconds since the first call, never 0.
pub(super) fn clock_ms() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

impl Conf {
    pub fn new(secret: Vec<u8>, servers: Vec<Server>, wait: Duration) -> Conf {
        let down = servers.iter().map(|_| Default::default()).collect();
        Conf {
            secret,
            servers,
            wait,
            interim: None,
            down,
        }
    }

    /// The servers to ask for `which` (AUTH, ACCT), in order: those up
    /// first, in the order of the line, then those held down.
    pub(super) fn order(&self, which: usize) -> Vec<usize> {
        let now = clock_ms();
        let is_down = |i: usize| self.down[i][which].load(Ordering::Relaxed) > now;
        let (mut up, down): (Vec<usize>, Vec<usize>) =
            (0..self.servers.len()).partition(|&i| !is_down(i));
        up.extend(down);
        up
    }

    /// Server `i` answered (`ok`) or did not.
    pub(super) fn mark(&self, i: usize, which: usize, ok: bool) {
        let until = if ok {
            0
        } else {
            clock_ms() + HOLD_DOWN.as_millis() as u64
        };
        self.down[i][which].store(until, Ordering::Relaxed);
    }

    /// The server to ask next for `which`, of those not `tried` (bits):
    /// the first that is up, in the order of the line, else the first
    /// held down ([`Conf::order`] without a list).
    pub(super) fn pick(&self, which: usize, tried: u8, now: u64) -> Option<usize> {
        let fresh = |i: &usize| tried & (1 << i) == 0;
        let n = self.servers.len().min(8);
        (0..n)
            .filter(fresh)
            .find(|&i| self.down[i][which].load(Ordering::Relaxed) <= now)
            .or_else(|| (0..n).find(fresh))
    }
}

/// A `radius` line's servers and secret, shared by every service of the
/// cfg (3proxy keeps one global list; the last `radius` line wins),
/// completed with the timeout when the whole cfg has loaded.
#[derive(Debug, Default)]
pub struct Slot(OnceLock<Arc<Conf>>);

impl Slot {
    /// Set once, at the end of the load.
    pub fn set(&self, c: Conf) {
        let _ = self.0.set(Arc::new(c));
    }

    pub fn get(&self) -> Option<&Arc<Conf>> {
        self.0.get()
    }
}

/// A warning, at most one every [`WARN_EVERY`] (a server outage would
/// otherwise give one per request); the next one says how many were
/// left out.
pub(super) fn warn_limited(msg: &str) {
    static LAST: AtomicU64 = AtomicU64::new(0);
    static SKIPPED: AtomicU64 = AtomicU64::new(0);
    let now = clock_ms();
    let last = LAST.load(Ordering::Relaxed);
    let due = last == 0 || now >= last + WARN_EVERY.as_millis() as u64;
    if due
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        match SKIPPED.swap(0, Ordering::Relaxed) {
            0 => log::warn!("{msg}"),
            n => log::warn!("{msg} ({n} more such warnings left out)"),
        }
    } else {
        SKIPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Least time between two of this module's warnings about servers.
const WARN_EVERY: Duration = Duration::from_secs(5);

/// A UDP socket connected to `to` (so only its datagrams reach us), from
/// `local` if given.
pub(super) fn open(to: SocketAddr, local: Option<IpAddr>) -> Option<UdpSocket> {
    let from = local.unwrap_or(match to {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    });
    match UdpSocket::bind(SocketAddr::new(from, 0)).and_then(|s| s.connect(to).map(|()| s)) {
        Ok(s) => Some(s),
        Err(e) => {
            log::warn!("radius {to}: {e}");
            None
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A `radius` line of `servers` with the secret `sec`, each waited for
    /// 300 ms (the parts' tests share it).
    pub(in crate::radius) fn conf(servers: &[SocketAddr]) -> Conf {
        Conf::new(
            b"sec".to_vec(),
            servers
                .iter()
                .map(|&a| Server {
                    auth: a,
                    acct: a,
                    local: None,
                })
                .collect(),
            Duration::from_millis(300),
        )
    }
}
