//! Name resolution for outgoing connections (3proxy's resolve.c and
//! `getip46` in common.c; 3proxy.cfg(5) `nserver`, `nscache`, `nsrecord`,
//! `fakeresolve`, `dialer`, `authnserver`).
//!
//! The resolver is process-wide, as in 3proxy: the cfg handlers record
//! its settings in a [`Config`], and `conf::State::finalize` installs it
//! with [`install`]; a reload installs a new one. Every service resolves
//! through [`resolve`].
//!
//! Without `nserver` names go to the system resolver (getaddrinfo). With
//! it, we ask the listed servers ourselves, in order: a UDP query (TCP
//! for `/tcp` servers, or when the UDP answer came truncated) with a
//! random ID, waiting at most the DNS timeout (`timeouts` slot 7) per
//! server. A reply counts only if it comes from the server asked (the
//! socket is connected), carries our ID, is a response and repeats our
//! question; anything else is dropped and we keep waiting, so a spoofed
//! reply must guess the ID and the port. The query and those checks are
//! `proto::dns`'s (on the `simple-dns` crate); this module sends, waits
//! and caches.
//!
//! `nscache`/`nscache6` turn on caching of A/AAAA answers (as in 3proxy,
//! without them every lookup asks the servers), with the answer's TTL
//! capped at 12 hours (0 counts as 1 s). `nsrecord` entries never expire
//! and are used whatever the resolver; `0.0.0.0` (or `::`) makes the name
//! fail to resolve. `fakeresolve` resolves every name to 127.0.0.2 (::2),
//! for parents that resolve names themselves. `dialer PROG` runs PROG when
//! a name fails, then tries once more.
//!
//! Invariants: a reply is parsed by the crate and checked before use;
//! nothing in a reply can panic us; every socket call has a timeout.

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::addr::{parse_ip, read_exact_by, Family};
use crate::conf::token::quote;
use crate::proto::dns::{Answer, Qt, Query, Reply};
use crate::res::Res;
use crate::timeouts::Timeouts;

/// Most `nserver` lines that count (3proxy's MAXNSERVERS); later ones are
/// ignored with a warning.
pub const MAX_SERVERS: usize = 5;
/// Longest time an answer stays cached, whatever its TTL says.
const MAX_TTL: u32 = 12 * 3600;
/// Smallest `nscache`/`nscache6` size 3proxy accepts.
pub const MIN_CACHE: usize = 256;
/// Largest DNS message we read over TCP (UDP answers are at most 64 KiB
/// by construction).
const MAX_MESSAGE: usize = 65535;
/// fakeresolve's answers.
const FAKE4: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const FAKE6: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 2);

/// One `nserver`/`authnserver`: where to ask, and whether over TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameServer {
    pub addr: SocketAddr,
    pub tcp: bool,
}

impl NameServer {
    /// `IP[:PORT][/tcp]`; an IPv6 address with a port needs brackets
    /// (`[::1]:53`). The port defaults to 53.
    pub fn parse(s: &str) -> Result<NameServer, String> {
        let (hostport, tcp) = match s.split_once('/') {
            Some((h, proto)) => (h, proto.contains("tcp")),
            None => (s, false),
        };
        let bad = || format!("'{}' is not IP[:PORT][/tcp]", quote(s));
        let (ip, port): (IpAddr, Option<&str>) = if let Some(ip) = parse_ip(hostport) {
            // A bare address, IPv6 with or without brackets.
            (ip, None)
        } else if let Some(rest) = hostport.strip_prefix('[') {
            let (ip, port) = rest.split_once("]:").ok_or_else(bad)?;
            (ip.parse().map_err(|_| bad())?, Some(port))
        } else {
            let (ip, port) = hostport.rsplit_once(':').ok_or_else(bad)?;
            (
                ip.parse::<Ipv4Addr>().map_err(|_| bad())?.into(),
                Some(port),
            )
        };
        let port = match port.map(str::parse::<u16>) {
            None => 53,
            Some(Ok(p)) if p != 0 => p,
            Some(_) => return Err(bad()),
        };
        Ok(NameServer {
            addr: SocketAddr::new(ip, port),
            tcp,
        })
    }
}

/// Which resolver answers: the last of `nserver` and `fakeresolve` in the
/// cfg wins, as in 3proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// getaddrinfo.
    #[default]
    System,
    /// Our own queries to the `nserver` list.
    Servers,
    /// Every name is 127.0.0.2 / ::2.
    Fake,
}

/// The resolver settings a cfg makes (what the handlers in
/// `conf::resolve_cmds` record).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    pub mode: Mode,
    pub servers: Vec<NameServer>,
    /// `authnserver`: for `dnsname` auth lookups; the `nserver`s if None.
    pub auth_server: Option<NameServer>,
    /// `nscache`/`nscache6`: cache sizes; None means no cache.
    pub cache4: Option<usize>,
    pub cache6: Option<usize>,
    /// `nsrecord` entries, by lowercased name.
    pub static4: HashMap<String, Ipv4Addr>,
    pub static6: HashMap<String, Ipv6Addr>,
    /// `dialer`: a shell command run when a name fails to resolve.
    pub dialer: Option<String>,
}

impl Config {
    /// `nsrecord NAME IP`: a record that never expires.
    pub fn add_record(&mut self, name: &str, ip: IpAddr) {
        let key = cache_key(name);
        match ip {
            IpAddr::V4(a) => self.static4.insert(key, a).map(drop),
            IpAddr::V6(a) => self.static6.insert(key, a).map(drop),
        };
    }
}

/// The installed resolver: the settings plus the caches they asked for.
struct Resolver {
    conf: Config,
    /// Wait for an answer, per server (`timeouts` DNS).
    dns_timeout: Duration,
    /// Sending a query (`timeouts` BYTE_LONG, as 3proxy).
    send_timeout: Duration,
    /// TCP connect to a server (`timeouts` CONNECT).
    connect_timeout: Duration,
    cache4: Mutex<Cache>,
    cache6: Mutex<Cache>,
    /// Held while `dialer` runs.
    dialing: Mutex<()>,
    /// How many times `dialer` has finished: a session that failed before
    /// the latest run ended just tries again, so sessions that fail
    /// together start it once.
    dialed: AtomicU64,
}

static RESOLVER: RwLock<Option<Arc<Resolver>>> = RwLock::new(None);

/// Make `conf` the process's resolver, with the final `timeouts`. Cached
/// answers survive a reload (3proxy keeps its cache too) when the new cfg
/// still caches that family.
pub fn install(conf: Config, timeouts: &Timeouts) {
    let mut slot = RESOLVER.write().unwrap_or_else(|e| e.into_inner());
    let (old4, old6) = match slot.as_ref() {
        Some(r) => (
            r.cache4.lock().ok().map(|mut c| c.take()),
            r.cache6.lock().ok().map(|mut c| c.take()),
        ),
        None => (None, None),
    };
    let r = Resolver::new(conf, timeouts);
    if let Ok(mut c) = r.cache4.lock() {
        c.adopt(old4.unwrap_or_default());
    }
    if let Ok(mut c) = r.cache6.lock() {
        c.adopt(old6.unwrap_or_default());
    }
    *slot = Some(Arc::new(r));
}

fn current() -> Option<Arc<Resolver>> {
    RESOLVER
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .cloned()
}

/// Resolve `host` for a connection to `port`, honouring the service's
/// family (`-4 -6 -46 -64`). IP literals (IPv6 with or without brackets)
/// are taken as they are, whatever the family. Failure is code 100.
pub fn resolve(host: &str, port: u16, family: Family) -> Result<SocketAddr, Res> {
    if let Some(ip) = parse_ip(host) {
        return Ok(SocketAddr::new(ip, port));
    }
    let Some(r) = current() else {
        return system(host, family).map(|ip| SocketAddr::new(ip, port));
    };
    let seen = r.dialed.load(Ordering::SeqCst);
    let ip = match r.lookup(host, family) {
        Ok(ip) => ip,
        Err(Failure::Blackholed) => return Err(Res::NOHOST),
        Err(Failure::NotFound) => match &r.conf.dialer {
            Some(prog) => {
                r.dial(prog, seen);
                r.lookup(host, family).map_err(|_| Res::NOHOST)?
            }
            None => return Err(Res::NOHOST),
        },
    };
    Ok(SocketAddr::new(ip, port))
}

/// Why a name did not resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// No address (no such name, no record of the family, no server
    /// answered).
    NotFound,
    /// An `nsrecord` to 0.0.0.0: fail, and never run the dialer.
    Blackholed,
}

/// The query types to try, in order, for a family.
fn qtypes(family: Family) -> &'static [Qt] {
    match family {
        Family::V4 => &[Qt::A],
        Family::V6 => &[Qt::Aaaa],
        Family::V46 => &[Qt::A, Qt::Aaaa],
        Family::V64 => &[Qt::Aaaa, Qt::A],
    }
}

impl Resolver {
    fn new(conf: Config, timeouts: &Timeouts) -> Resolver {
        Resolver {
            dns_timeout: timeouts.get(Timeouts::DNS),
            send_timeout: timeouts.get(Timeouts::BYTE_LONG),
            connect_timeout: timeouts.get(Timeouts::CONNECT),
            cache4: Mutex::new(Cache::new(conf.cache4.unwrap_or(0))),
            cache6: Mutex::new(Cache::new(conf.cache6.unwrap_or(0))),
            conf,
            dialing: Mutex::new(()),
            dialed: AtomicU64::new(0),
        }
    }

    fn lookup(&self, host: &str, family: Family) -> Result<IpAddr, Failure> {
        let key = cache_key(host);
        if self.conf.mode == Mode::System {
            // Static records first, then getaddrinfo for the rest.
            for &qt in qtypes(family) {
                match self.static_record(&key, qt) {
                    Some(ip) if ip.is_unspecified() => return Err(Failure::Blackholed),
                    Some(ip) => return Ok(ip),
                    None => {}
                }
            }
            return system(host, family).map_err(|_| Failure::NotFound);
        }
        for &qt in qtypes(family) {
            if let Some(ip) = self.lookup_one(host, &key, qt)? {
                return Ok(ip);
            }
        }
        Err(Failure::NotFound)
    }

    /// One record type: fake, static, cached, or asked of the servers.
    fn lookup_one(&self, host: &str, key: &str, qt: Qt) -> Result<Option<IpAddr>, Failure> {
        if self.conf.mode == Mode::Fake {
            return Ok(Some(if qt == Qt::Aaaa {
                FAKE6.into()
            } else {
                FAKE4.into()
            }));
        }
        match self.static_record(key, qt) {
            Some(ip) if ip.is_unspecified() => return Err(Failure::Blackholed),
            Some(ip) => return Ok(Some(ip)),
            None => {}
        }
        let cache = if qt == Qt::Aaaa {
            &self.cache6
        } else {
            &self.cache4
        };
        let now = Instant::now();
        if let Some(ip) = cache.lock().ok().and_then(|mut c| c.get(key, now)) {
            return Ok(Some(ip));
        }
        for server in &self.conf.servers {
            match self.ask(server, host, qt) {
                Ok(Answer::Addr(ip, ttl)) => {
                    if let Ok(mut c) = cache.lock() {
                        c.put(key, ip, ttl, Instant::now());
                    }
                    return Ok(Some(ip));
                }
                // A server answered: no such name or no record of this
                // type. Others would say the same (3proxy stops here too).
                Ok(Answer::None | Answer::Name(_)) => return Ok(None),
                Err(e) => log::debug!("nserver {}: {host}: {e}", server.addr),
            }
        }
        Ok(None)
    }

    fn static_record(&self, key: &str, qt: Qt) -> Option<IpAddr> {
        match qt {
            Qt::A => self.conf.static4.get(key).map(|&a| a.into()),
            Qt::Aaaa => self.conf.static6.get(key).map(|&a| a.into()),
            Qt::Ptr => None,
        }
    }

    fn ask(&self, server: &NameServer, name: &str, qt: Qt) -> io::Result<Answer> {
        let q = Query::new(name, qt)?;
        if !server.tcp {
            match self.ask_udp(server, &q)? {
                Reply::Done(a) => return Ok(a),
                Reply::Truncated => {}
            }
        }
        self.ask_tcp(server, &q)
    }

    fn ask_udp(&self, server: &NameServer, q: &Query) -> io::Result<Reply> {
        let any: IpAddr = if server.addr.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        };
        let sock = UdpSocket::bind(SocketAddr::new(any, 0))?;
        // Connected: the kernel drops datagrams from any other address.
        sock.connect(server.addr)?;
        sock.set_write_timeout(Some(self.send_timeout))?;
        sock.send(&q.wire)?;
        let deadline = Instant::now() + self.dns_timeout;
        let mut buf = vec![0u8; MAX_MESSAGE];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            sock.set_read_timeout(Some(left))?;
            let n = match sock.recv(&mut buf) {
                Ok(n) => n,
                // ICMP port unreachable from an earlier send: nobody there.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => return Err(e),
                Err(e) if crate::addr::is_timeout(&e) => return Err(io::ErrorKind::TimedOut.into()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            match q.check(&buf[..n]) {
                Some(reply) => return Ok(reply),
                None => log::debug!(
                    "nserver {}: dropped a reply that does not match",
                    server.addr
                ),
            }
        }
    }

    fn ask_tcp(&self, server: &NameServer, q: &Query) -> io::Result<Answer> {
        let deadline = Instant::now() + self.dns_timeout;
        let mut s = TcpStream::connect_timeout(&server.addr, self.connect_timeout)?;
        let _ = s.set_nodelay(true);
        s.set_write_timeout(Some(self.send_timeout))?;
        let len = u16::try_from(q.wire.len()).map_err(|_| io::ErrorKind::InvalidInput)?;
        let mut msg = len.to_be_bytes().to_vec();
        msg.extend_from_slice(&q.wire);
        s.write_all(&msg)?;
        // One query per connection, so the first message is the answer;
        // a bad one ends the attempt with this server.
        let mut len = [0u8; 2];
        read_exact_by(&mut s, &mut len, deadline)?;
        let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
        read_exact_by(&mut s, &mut buf, deadline)?;
        match q.check(&buf) {
            Some(Reply::Done(a)) => Ok(a),
            Some(Reply::Truncated) => Err(io::Error::other("truncated answer over TCP")),
            None => Err(io::Error::other("a reply that does not match the query")),
        }
    }

    /// Run `dialer` unless it finished since `seen` was read (once at a
    /// time), waiting for it at most the DNS timeout; a dialer still
    /// running then is left to finish on its own.
    fn dial(&self, prog: &str, seen: u64) {
        let _one = self.dialing.lock().unwrap_or_else(|e| e.into_inner());
        if self.dialed.load(Ordering::SeqCst) != seen {
            // It ran since our lookup began: just try again.
            return;
        }
        self.run_dialer(prog);
        self.dialed.fetch_add(1, Ordering::SeqCst);
    }

    fn run_dialer(&self, prog: &str) {
        let mut child = match std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(prog)
            .stdin(std::process::Stdio::null())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                log::warn!("dialer: cannot run /bin/sh: {e}");
                return;
            }
        };
        let deadline = Instant::now() + self.dns_timeout;
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= deadline => {
                    log::warn!(
                        "dialer: '{}' still running, not waiting for it",
                        quote(prog)
                    );
                    // Reap it when it ends, so it leaves no zombie.
                    let _ = std::thread::Builder::new()
                        .name("dialer-reaper".into())
                        .spawn(move || child.wait());
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// getaddrinfo, filtered by family in the family's order of preference.
fn system(host: &str, family: Family) -> Result<IpAddr, Res> {
    let addrs: Vec<SocketAddr> = (host, 0)
        .to_socket_addrs()
        .map_err(|_| Res::NOHOST)?
        .collect();
    let v4 = addrs.iter().find(|a| a.is_ipv4());
    let v6 = addrs.iter().find(|a| a.is_ipv6());
    let pick = match family {
        Family::V4 => v4,
        Family::V6 => v6,
        Family::V46 => v4.or(v6),
        Family::V64 => v6.or(v4),
    };
    pick.map(|a| a.ip()).ok_or(Res::NOHOST)
}

/// Names are case-insensitive; a trailing dot changes nothing.
fn cache_key(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

// ---------------------------------------------------------------------------
// Lookups for `dnspr`

/// An address `dnspr` can answer with, and how long the client may keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub ip: IpAddr,
    /// Seconds: what is left of a cached answer, the server's TTL (capped
    /// as the cache caps it) for a fresh one, 12 hours for an `nsrecord`.
    pub ttl: u32,
    /// The `nserver` that answered, None for a static or cached record.
    pub server: Option<SocketAddr>,
}

/// An A (or, with `v6`, AAAA) record for `host` as 3proxy's `udpresolve`
/// finds one: `nsrecord`, then the cache, then the `nserver`s in order
/// (the first that answers decides). Neither getaddrinfo nor
/// `fakeresolve` is asked; an `nsrecord` to 0.0.0.0 is answered as it is.
pub fn record(host: &str, v6: bool) -> Option<Record> {
    current()?.record(host, if v6 { Qt::Aaaa } else { Qt::A })
}

/// The first `nserver`, where `dnspr` forwards what it does not answer.
pub fn first_server() -> Option<NameServer> {
    current()?.conf.servers.first().copied()
}

impl Resolver {
    fn record(&self, host: &str, qt: Qt) -> Option<Record> {
        let key = cache_key(host);
        if let Some(ip) = self.static_record(&key, qt) {
            return Some(Record {
                ip,
                ttl: MAX_TTL,
                server: None,
            });
        }
        let cache = if qt == Qt::Aaaa {
            &self.cache6
        } else {
            &self.cache4
        };
        let now = Instant::now();
        if let Some((ip, ttl)) = cache.lock().ok().and_then(|mut c| c.get_ttl(&key, now)) {
            return Some(Record {
                ip,
                ttl,
                server: None,
            });
        }
        for server in &self.conf.servers {
            match self.ask(server, host, qt) {
                Ok(Answer::Addr(ip, ttl)) => {
                    if let Ok(mut c) = cache.lock() {
                        c.put(&key, ip, ttl, Instant::now());
                    }
                    return Some(Record {
                        ip,
                        ttl: ttl.clamp(1, MAX_TTL),
                        server: Some(server.addr),
                    });
                }
                Ok(Answer::None | Answer::Name(_)) => return None,
                Err(e) => log::debug!("nserver {}: {host}: {e}", server.addr),
            }
        }
        None
    }
}

// ---------------------------------------------------------------------------
// Reverse lookups for `auth dnsname`

/// The name `ip` has in the DNS, forward-confirmed: its PTR name (asked
/// of `authnserver`, else the `nserver`s), if that name resolves back to
/// `ip` through the same server(s). None if there is none, or without
/// `nserver`/`authnserver` (3proxy's `dnsname` needs them too).
pub fn dnsname(ip: IpAddr) -> Option<String> {
    current()?.dnsname(ip)
}

impl Resolver {
    fn dnsname(&self, ip: IpAddr) -> Option<String> {
        let servers: Vec<NameServer> = match self.conf.auth_server {
            Some(s) => vec![s],
            None if self.conf.mode == Mode::Servers => self.conf.servers.clone(),
            None => return None,
        };
        let arpa = reverse_name(ip);
        let name = servers
            .iter()
            .find_map(|s| match self.ask(s, &arpa, Qt::Ptr) {
                Ok(Answer::Name(n)) => Some(n),
                _ => None,
            })?;
        let qt = if ip.is_ipv4() { Qt::A } else { Qt::Aaaa };
        let confirmed = servers
            .iter()
            .find_map(|s| match self.ask(s, &name, qt) {
                Ok(Answer::Addr(a, _)) => Some(a),
                _ => None,
            })
            .is_some_and(|a| a == ip);
        confirmed.then_some(name)
    }
}

/// `4.3.2.1.in-addr.arpa` / the nibble form under `ip6.arpa`.
fn reverse_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            format!("{}.{}.{}.{}.in-addr.arpa", o[3], o[2], o[1], o[0])
        }
        IpAddr::V6(a) => {
            let mut s = String::with_capacity(72);
            for b in a.octets().iter().rev() {
                s.push_str(&format!("{:x}.{:x}.", b & 0xf, b >> 4));
            }
            s.push_str("ip6.arpa");
            s
        }
    }
}

// ---------------------------------------------------------------------------
// The cache

/// Answers of one family by name, each until its TTL runs out. A size of
/// 0 means no caching.
#[derive(Debug, Default)]
struct Cache {
    limit: usize,
    map: HashMap<String, (IpAddr, Instant)>,
    /// When expired entries were last swept (at most once a second, so a
    /// full cache of live entries costs nothing per miss).
    swept: Option<Instant>,
}

impl Cache {
    fn new(limit: usize) -> Cache {
        Cache {
            limit,
            map: HashMap::new(),
            swept: None,
        }
    }

    fn get(&mut self, key: &str, now: Instant) -> Option<IpAddr> {
        match self.map.get(key) {
            Some(&(ip, until)) if until > now => Some(ip),
            Some(_) => {
                self.map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Like `get`, with the seconds left (at least 1).
    fn get_ttl(&mut self, key: &str, now: Instant) -> Option<(IpAddr, u32)> {
        let ip = self.get(key, now)?;
        let left = self.map.get(key)?.1.saturating_duration_since(now);
        Some((ip, (left.as_secs() as u32).max(1)))
    }

    fn put(&mut self, key: &str, ip: IpAddr, ttl: u32, now: Instant) {
        if self.limit == 0 {
            return;
        }
        let ttl = ttl.clamp(1, MAX_TTL);
        if self.map.len() >= self.limit && !self.map.contains_key(key) {
            if self
                .swept
                .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
            {
                self.map.retain(|_, &mut (_, until)| until > now);
                self.swept = Some(now);
            }
            if self.map.len() >= self.limit {
                return;
            }
        }
        self.map.insert(
            key.to_string(),
            (ip, now + Duration::from_secs(u64::from(ttl))),
        );
    }

    fn take(&mut self) -> HashMap<String, (IpAddr, Instant)> {
        std::mem::take(&mut self.map)
    }

    /// Keep what a previous resolver had cached, up to our own limit.
    fn adopt(&mut self, old: HashMap<String, (IpAddr, Instant)>) {
        for (k, v) in old {
            if self.map.len() >= self.limit {
                break;
            }
            self.map.insert(k, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::dns::tests::a;
    use simple_dns::rdata::RData;
    use simple_dns::{Name, Packet, CLASS, QTYPE};

    #[test]
    fn parses_nserver_addresses() {
        let ns = |s| NameServer::parse(s).map(|n| (n.addr.to_string(), n.tcp));
        assert_eq!(ns("10.0.0.1"), Ok(("10.0.0.1:53".into(), false)));
        assert_eq!(ns("10.0.0.1:5353"), Ok(("10.0.0.1:5353".into(), false)));
        assert_eq!(ns("10.0.0.1/tcp"), Ok(("10.0.0.1:53".into(), true)));
        assert_eq!(ns("10.0.0.1:54/tcp"), Ok(("10.0.0.1:54".into(), true)));
        assert_eq!(ns("::1"), Ok(("[::1]:53".into(), false)));
        assert_eq!(ns("[::1]"), Ok(("[::1]:53".into(), false)));
        assert_eq!(ns("[::1]:54/tcp"), Ok(("[::1]:54".into(), true)));
        for bad in [
            "",
            "name",
            "10.0.0.1:",
            "10.0.0.1:0",
            "10.0.0.1:x",
            "[::1]x",
            "1.2.3:4",
        ] {
            assert!(NameServer::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reverse_names() {
        assert_eq!(
            reverse_name("192.0.2.5".parse().unwrap()),
            "5.2.0.192.in-addr.arpa"
        );
        let v6 = reverse_name("2001:db8::1".parse().unwrap());
        assert!(v6.starts_with("1.0.0.0.0.0.0.0."), "{v6}");
        assert!(v6.ends_with("8.b.d.0.1.0.0.2.ip6.arpa"), "{v6}");
    }

    #[test]
    fn resolves_literals_whatever_the_family() {
        assert_eq!(
            resolve("::1", 7, Family::V4).unwrap(),
            "[::1]:7".parse().unwrap()
        );
        assert_eq!(
            resolve("127.0.0.1", 7, Family::V6).unwrap(),
            "127.0.0.1:7".parse().unwrap()
        );
    }

    /// A one-thread DNS server for unit tests: answers PTR and A from
    /// `records` (name -> RData) until `n` queries have come.
    fn serve(n: usize, records: Vec<(&'static str, RData<'static>)>) -> SocketAddr {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            for _ in 0..n {
                let Ok((len, from)) = sock.recv_from(&mut buf) else {
                    return;
                };
                let q = Packet::parse(&buf[..len]).unwrap();
                let mut p = Packet::new_reply(q.id());
                let question = q.questions[0].clone();
                let name = question.qname.to_string();
                for (n, rd) in &records {
                    if *n == name && QTYPE::TYPE(rd.type_code()) == question.qtype {
                        p.answers.push(simple_dns::ResourceRecord::new(
                            Name::new_unchecked(n),
                            CLASS::IN,
                            60,
                            rd.clone(),
                        ));
                    }
                }
                p.questions.push(question);
                let _ = sock.send_to(&p.build_bytes_vec().unwrap(), from);
            }
        });
        addr
    }

    #[test]
    fn dnsname_is_forward_confirmed() {
        let ptr = |n: &'static str| RData::PTR(simple_dns::rdata::PTR(Name::new_unchecked(n)));
        let addr = serve(
            4,
            vec![
                ("5.0.0.127.in-addr.arpa", ptr("good.test")),
                ("good.test", a([127, 0, 0, 5])),
                ("6.0.0.127.in-addr.arpa", ptr("liar.test")),
                ("liar.test", a([127, 0, 0, 99])),
            ],
        );
        let conf = Config {
            auth_server: Some(NameServer { addr, tcp: false }),
            ..Config::default()
        };
        let r = Resolver::new(conf, &Timeouts::default());
        assert_eq!(
            r.dnsname("127.0.0.5".parse().unwrap()).as_deref(),
            Some("good.test")
        );
        // The PTR name resolves elsewhere: not confirmed.
        assert_eq!(r.dnsname("127.0.0.6".parse().unwrap()), None);
        // No authnserver and no nserver: no reverse lookups.
        let r = Resolver::new(Config::default(), &Timeouts::default());
        assert_eq!(r.dnsname("127.0.0.5".parse().unwrap()), None);
    }

    #[test]
    fn cache_honours_ttl_and_limit() {
        let t0 = Instant::now();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let mut c = Cache::new(2);
        c.put("a", ip, 0, t0); // 0 counts as 1 s
        assert_eq!(c.get("a", t0), Some(ip));
        assert_eq!(c.get("a", t0 + Duration::from_millis(1500)), None);
        c.put("b", ip, 1_000_000, t0); // capped at 12 h
        assert_eq!(
            c.get("b", t0 + Duration::from_secs(12 * 3600 - 1)),
            Some(ip)
        );
        assert_eq!(c.get("b", t0 + Duration::from_secs(12 * 3600 + 1)), None);
        // Full of live entries: new names are not cached...
        c.put("c", ip, 100, t0);
        c.put("d", ip, 100, t0);
        c.put("e", ip, 100, t0);
        assert_eq!(c.get("e", t0), None);
        // ...until some expire.
        c.put("e", ip, 100, t0 + Duration::from_secs(200));
        assert_eq!(c.get("e", t0 + Duration::from_secs(200)), Some(ip));
        let mut off = Cache::new(0);
        off.put("a", ip, 100, t0);
        assert_eq!(off.get("a", t0), None);
    }

    #[test]
    fn keys_ignore_case_and_the_root_dot() {
        assert_eq!(cache_key("WWW.Example.ORG."), "www.example.org");
    }
}
