//! Parent proxies, the pure half: the `parent` lines of an `allow` entry
//! (3proxy.cfg(5) "parent"; 3proxy's redirect.c `handleredirect`), which
//! hops one attempt takes, and the local redirections (`parent TYPE
//! 0.0.0.0 0`). Dialing and talking to the hops is `chain`'s.
//!
//! [`pick`] chooses the hops of one attempt: consecutive parents form a
//! group until their weights reach 1000; one parent of each group is taken
//! with probability weight/1000 (a group short of 1000 may give none), and
//! the groups, in cfg order, form the chain. The random source is passed
//! in, so it is tested without sockets.
//!
//! Invariant: nothing here does IO.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::conf::token::quote;
use crate::health::{Policy, Shared};
use crate::res::Res;

/// The parents of one ACL entry, in cfg order; shared by every request
/// the entry allows.
pub type Parents = Arc<[Hop]>;

/// A parent's type (3proxy's `redirs[]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Connect and relay; ends the chain.
    Tcp,
    /// An HTTP proxy: the `proxy` service sends it requests in absolute
    /// form; for other services it is `tcp`. Ends the chain.
    Http,
    /// HTTP CONNECT; `ConnectPlus` sends the host name.
    Connect,
    ConnectPlus,
    /// SOCKS4; `Socks4Plus` is 4a (sends the name); `Socks4b` takes a
    /// 3-byte reply.
    Socks4,
    Socks4Plus,
    Socks4b,
    /// SOCKS5; `Socks5Plus` sends the name; `Socks5b` does not read the
    /// address of an IPv4 reply.
    Socks5,
    Socks5Plus,
    Socks5b,
    /// Not a hop: the source address of the outgoing connection.
    ExtIp,
    /// Not a hop: a PROXY protocol v1 header to the next hop.
    Ha,
    /// Local redirections (address 0.0.0.0, port 0 only): the client is
    /// handed to that service's handler in this process.
    Pop3,
    Imap,
    Smtp,
    Ftp,
    Admin,
    Tls,
    Dns,
}

/// The cfg names, longest first where one is a prefix of another.
const KINDS: &[(&str, Kind)] = &[
    ("tcp", Kind::Tcp),
    ("http", Kind::Http),
    ("connect+", Kind::ConnectPlus),
    ("connect", Kind::Connect),
    ("socks4+", Kind::Socks4Plus),
    ("socks4b", Kind::Socks4b),
    ("socks4", Kind::Socks4),
    ("socks5+", Kind::Socks5Plus),
    ("socks5b", Kind::Socks5b),
    ("socks5", Kind::Socks5),
    ("extip", Kind::ExtIp),
    ("ha", Kind::Ha),
    ("pop3", Kind::Pop3),
    ("imap", Kind::Imap),
    ("smtp", Kind::Smtp),
    ("ftp", Kind::Ftp),
    ("admin", Kind::Admin),
    ("tls", Kind::Tls),
    ("dns", Kind::Dns),
];

impl Kind {
    /// The type's cfg name.
    pub fn name(self) -> &'static str {
        KINDS
            .iter()
            .find(|(_, k)| *k == self)
            .map_or("?", |(n, _)| n)
    }

    /// Types that exist only as local redirections.
    fn local_only(self) -> bool {
        matches!(
            self,
            Kind::Pop3
                | Kind::Imap
                | Kind::Smtp
                | Kind::Ftp
                | Kind::Admin
                | Kind::Tls
                | Kind::Dns
                | Kind::Ha
        )
    }

    /// Types that send the host name instead of the address.
    pub fn sends_name(self) -> bool {
        matches!(
            self,
            Kind::ConnectPlus | Kind::Socks4Plus | Kind::Socks5Plus
        )
    }
}

/// One `parent` line (3proxy's `struct chain`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// 1..=1000.
    pub weight: u32,
    pub kind: Kind,
    /// The address as written: what a `+` hop before this one is asked to
    /// connect to (3proxy's `exthost`).
    pub host: String,
    /// The address, resolved when the cfg is read. An unspecified IP keeps
    /// the requested address and port 0 the requested port (first hop).
    pub addr: SocketAddr,
    /// `extip` with `addr/len`: a random address inside the prefix.
    pub prefix: Option<u8>,
    /// Credentials for the parent; `*` passes the client's own.
    pub user: Option<String>,
    pub password: Option<String>,
    /// The type ends in `s` (`https`, `socks5s`, `connect+s`, ...): the
    /// hop speaks TLS, its protocol inside.
    pub tls: bool,
    /// A parent given by a name with addresses of both families: the
    /// address of the other family (happy eyeballs, `chain`).
    pub alt: Option<IpAddr>,
    /// `parenthealth` as it stood at the line.
    pub policy: Policy,
    /// Whether it is down (`health`), kept by the words of its line.
    pub health: Shared,
}

impl Hop {
    /// Parse the arguments of `parent WEIGHT TYPE IP PORT [USER [PASS]]`
    /// (without the command). `resolve` turns a name into an address.
    pub fn parse(
        args: &[String],
        resolve: impl Fn(&str) -> Result<IpAddr, String>,
    ) -> Result<Hop, String> {
        if args.len() < 4 || args.len() > 6 {
            return Err("takes WEIGHT TYPE ADDRESS PORT [USER [PASSWORD]]".into());
        }
        let weight: u32 = args[0]
            .parse()
            .ok()
            .filter(|w| (1..=1000).contains(w))
            .ok_or_else(|| format!("bad weight '{}': takes 1 to 1000", quote(&args[0])))?;
        let t = args[1].as_str();
        let Some(&(name, kind)) = KINDS.iter().find(|(n, _)| t.starts_with(n)) else {
            return Err(format!("unknown parent type '{}'", quote(t)));
        };
        let tls = match &t[name.len()..] {
            "" => false,
            "s" if !kind.local_only() && kind != Kind::ExtIp => true,
            "s" => {
                return Err(format!(
                    "'{}': {} is not a hop to speak TLS to",
                    quote(t),
                    kind.name()
                ))
            }
            _ => return Err(format!("unknown parent type '{}'", quote(t))),
        };
        let host = args[2].clone();
        if host.starts_with("unix:") {
            return Err("unix socket parents are not supported yet".into());
        }
        let (ip_text, prefix) = match host.split_once('/') {
            Some((ip, len)) => {
                let len: u8 = len
                    .parse()
                    .ok()
                    .filter(|l| *l <= 128)
                    .ok_or_else(|| format!("bad prefix length in '{}'", quote(&host)))?;
                (ip, Some(len))
            }
            None => (host.as_str(), None),
        };
        let ip = resolve(ip_text)?;
        if prefix.is_some() && (kind != Kind::ExtIp || !ip.is_ipv6()) {
            return Err(format!(
                "'{}': an address prefix is for IPv6 'extip' parents only",
                quote(&host)
            ));
        }
        let port: u16 = args[3]
            .parse()
            .map_err(|_| format!("bad port '{}'", quote(&args[3])))?;
        let addr = SocketAddr::new(ip, port);
        if kind.local_only() && (!ip.is_unspecified() || port != 0) {
            return Err(format!(
                "'{}' is a local redirection: its address must be 0.0.0.0 and its port 0",
                quote(t)
            ));
        }
        Ok(Hop {
            weight,
            kind,
            host: ip_text.to_string(),
            addr,
            prefix,
            user: args.get(4).cloned(),
            password: args.get(5).cloned(),
            tls,
            alt: None,
            policy: Policy::default(),
            health: Shared::alone(format!("{t} {ip_text}:{port}")),
        })
    }

    /// How log lines name the parent: `TYPE HOST:PORT`.
    pub fn name(&self) -> &str {
        &self.health.name
    }

    /// `0.0.0.0 0`: not a proxy to dial, a handler in this process.
    pub fn is_local(&self) -> bool {
        self.addr.ip().is_unspecified() && self.addr.port() == 0
    }

    /// Counted in `%h` (3proxy counts every hop but `extip` and `ha`).
    pub fn counts(&self) -> bool {
        !matches!(self.kind, Kind::ExtIp | Kind::Ha)
    }
}

// --- Local redirection --------------------------------------------------
//
// `parent W TYPE 0.0.0.0 0` does not dial: the client is handed to the
// handler of TYPE in this process (3proxy's `redirs[]` table and its
// childfunc loop). The service that met the redirection says "granted"
// in its own protocol where it has one, records the hand-off on its
// client (`Client::hand_over`) and returns; its entry point then returns
// [`Next::Handoff`], and the client thread's loop (`services::child`)
// runs the target handler on the same thread and client. Handlers never
// call one another, so a chain of hand-offs does not deepen the (small)
// client stack, and [`MAX_HANDOFFS`] stops a chain that would go round
// for ever. Nothing of this is thread-local: the client carries it.

/// 3proxy's rule for the handler a client was redirected to (`redirected`:
/// the client came through a local redirection): an ACL entry whose first
/// parent is a local redirection (`0.0.0.0 0`) is skipped, so the request
/// is not sent round the same redirection again.
pub fn skip_on_redirect(parents: &[Hop], redirected: bool) -> bool {
    redirected && parents.first().is_some_and(Hop::is_local)
}

/// Hand-offs one client may take; one more ends the session with
/// [`REDIRECTION_LOOP`] (3proxy allows 16 handlers per client, too).
pub const MAX_HANDOFFS: u32 = 15;
/// 3proxy's code for a client sent round local redirections too often.
pub const REDIRECTION_LOOP: Res = Res::REDIRECTION_LOOP;

/// What a service's handler leaves its client thread to do (3proxy's
/// child function returns the next child).
#[derive(Debug)]
pub enum Next {
    /// The session is over (its record is written when the client drops).
    Done,
    /// Serve the client with another handler.
    Handoff(Handoff),
}

/// The destination a service chose before it handed its client over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    /// The host name the client gave, if it gave a name.
    pub name: Option<String>,
    /// Where it resolved to, with the port.
    pub addr: SocketAddr,
}

impl Known {
    /// The host as the next handler takes it: the name, or the address.
    pub fn host(&self) -> String {
        match &self.name {
            Some(n) => n.clone(),
            None => self.addr.ip().to_string(),
        }
    }
}

/// A client to hand to the handler of `kind`.
#[derive(Debug)]
pub struct Handoff {
    pub kind: Kind,
    /// Hops the redirection took, the local one included.
    pub hops: u32,
    /// Bytes read from the client that the next handler must see first.
    pub early: Vec<u8>,
    /// The destination already chosen, if the first handler knew one.
    pub dest: Option<Known>,
}

impl Handoff {
    /// A hand-off of a client whose destination the first handler chose
    /// already (`name` when the client gave a name): what every service
    /// that meets `Route::Local` on its way to a destination hands over.
    pub fn to(
        kind: Kind,
        hops: u32,
        early: Vec<u8>,
        name: Option<String>,
        addr: SocketAddr,
    ) -> Handoff {
        Handoff {
            kind,
            hops,
            early,
            dest: Some(Known { name, addr }),
        }
    }
}

/// Check that the handler of `h.kind` can take a TCP client. Err NOTIMPL
/// for `dns`: its handler serves UDP datagrams (the caller refuses the
/// client in its own protocol).
pub fn check_handoff(h: &Handoff) -> Result<(), Res> {
    if !takes_tcp(h.kind) {
        log::warn!(
            "a TCP client cannot be redirected locally to '{}': that handler is UDP only",
            h.kind.name()
        );
        return Err(Res::NOTIMPL);
    }
    Ok(())
}

/// Whether the handler of `kind` can take a client of a TCP service: all
/// but `dns`, which answers UDP datagrams (and `extip` and `ha`, which
/// are not handlers).
pub fn takes_tcp(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Tcp
            | Kind::Http
            | Kind::Connect
            | Kind::ConnectPlus
            | Kind::Socks4
            | Kind::Socks4Plus
            | Kind::Socks4b
            | Kind::Socks5
            | Kind::Socks5Plus
            | Kind::Socks5b
            | Kind::Pop3
            | Kind::Imap
            | Kind::Smtp
            | Kind::Ftp
            | Kind::Admin
            | Kind::Tls
    )
}

impl Kind {
    /// The service (by its cfg name in the service table) whose handler
    /// takes a client locally redirected to this type (3proxy's
    /// `redirs[]`): `http`, `connect` and `connect+` are `proxy`, the
    /// SOCKS types `socks`. None for `dns`, `extip` and `ha`.
    pub fn handler(self) -> Option<&'static str> {
        Some(match self {
            Kind::Tcp => "tcppm",
            Kind::Http | Kind::Connect | Kind::ConnectPlus => "proxy",
            Kind::Socks4
            | Kind::Socks4Plus
            | Kind::Socks4b
            | Kind::Socks5
            | Kind::Socks5Plus
            | Kind::Socks5b => "socks",
            Kind::Pop3 => "pop3p",
            Kind::Imap => "imapp",
            Kind::Smtp => "smtpp",
            Kind::Ftp => "ftppr",
            Kind::Admin => "admin",
            Kind::Tls => "tlspr",
            Kind::Dns | Kind::ExtIp | Kind::Ha => return None,
        })
    }
}

/// Choose the hops of one attempt (3proxy's `handleredirect` loop).
/// `rand` gives uniformly random numbers; only their value mod 1000 is
/// used.
pub fn pick<'a>(hops: &'a [Hop], rand: &mut impl FnMut() -> u32) -> Vec<&'a Hop> {
    pick_avoiding(hops, rand, |_| false)
}

/// [`pick`], leaving out the hops `avoid` names (down, or failed in an
/// earlier attempt of the request) while another hop of their group is
/// not avoided: a draw that lands on an avoided hop is made again among
/// the others of its group, by their weights. A group whose hops are all
/// avoided draws as [`pick`] does; a draw that lands on no hop (a group
/// short of 1000) stays no hop.
pub fn pick_avoiding<'a>(
    hops: &'a [Hop],
    rand: &mut impl FnMut() -> u32,
    avoid: impl Fn(&Hop) -> bool,
) -> Vec<&'a Hop> {
    let mut out = Vec::new();
    // What is left of the current group's 1000, and the draw for it.
    let mut left: i64 = 1000;
    let mut draw = i64::from(rand() % 1000);
    let mut taken: Option<usize> = None;
    let mut start = 0;
    for (i, h) in hops.iter().enumerate() {
        left -= i64::from(h.weight);
        // This hop covers the draws in [left, left + weight).
        if taken.is_none() && left <= draw {
            taken = Some(i);
        }
        let full = left <= 0;
        if full || i + 1 == hops.len() {
            if let Some(t) = taken {
                out.push(instead(&hops[start..=i], t - start, rand, &avoid));
            }
            start = i + 1;
            taken = None;
        }
        if full {
            // The group is full: the next parent starts a new one.
            left += 1000;
            draw = i64::from(rand() % 1000);
        }
    }
    out
}

/// The hop `group[t]` that a draw took, or, if it is to be avoided, one
/// of the others drawn by weight (itself if all are to be avoided).
fn instead<'a>(
    group: &'a [Hop],
    t: usize,
    rand: &mut impl FnMut() -> u32,
    avoid: &impl Fn(&Hop) -> bool,
) -> &'a Hop {
    if !avoid(&group[t]) {
        return &group[t];
    }
    let total: u64 = group
        .iter()
        .filter(|h| !avoid(h))
        .map(|h| u64::from(h.weight))
        .sum();
    if total == 0 {
        return &group[t];
    }
    let mut r = u64::from(rand()) % total;
    for h in group.iter().filter(|h| !avoid(h)) {
        let w = u64::from(h.weight);
        if r < w {
            return h;
        }
        r -= w;
    }
    &group[t]
}

/// A random number for [`pick`] and `extip` prefixes: std's per-process
/// random hash keys applied to a counter (no RNG crate needed; this is
/// load spreading, not cryptography).
pub fn random() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static N: AtomicU32 = AtomicU32::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(N.fetch_add(1, Ordering::Relaxed));
    h.finish() as u32
}

/// `parentretries`: attempts per request, process-wide as in 3proxy
/// (default 2). Set when the cfg has loaded.
static RETRIES: AtomicU32 = AtomicU32::new(DEFAULT_RETRIES);
pub const DEFAULT_RETRIES: u32 = 2;

pub fn set_retries(n: u32) {
    RETRIES.store(n.max(1), Ordering::Relaxed);
}

/// Attempts per request (`parentretries`).
pub fn retries() -> u32 {
    RETRIES.load(Ordering::Relaxed).max(1)
}

/// The source address an `extip` hop gives: its address; the client's
/// for 0.0.0.0; a random one inside an IPv6 prefix.
pub fn extip(h: &Hop, client: Option<SocketAddr>, rand: &mut impl FnMut() -> u32) -> IpAddr {
    let ip = h.addr.ip();
    if ip.is_unspecified() {
        if let Some(c) = client {
            return c.ip();
        }
    }
    match (ip, h.prefix) {
        (IpAddr::V6(v6), Some(len)) => {
            let r = (u128::from(rand()) << 96)
                | (u128::from(rand()) << 64)
                | (u128::from(rand()) << 32)
                | u128::from(rand());
            IpAddr::V6(random_in_prefix(v6, len, r))
        }
        _ => ip,
    }
}

/// A chain of one `extip` hop that makes the outgoing connection from
/// `ip` (the source address `authcache ext` gives back).
pub fn from_source(ip: IpAddr) -> Parents {
    Arc::from([Hop {
        weight: 1000,
        kind: Kind::ExtIp,
        host: ip.to_string(),
        addr: SocketAddr::new(ip, 0),
        prefix: None,
        user: None,
        password: None,
        tls: false,
        alt: None,
        policy: Policy::default(),
        health: Shared::alone(format!("extip {ip}")),
    }])
}

/// For `authcache ext`: draw the hops of an attempt now, with the source
/// address its `extip` hops give (3proxy draws while it checks the ACL
/// and caches what the draw set). Returns that source (None when the draw
/// set none) and a chain that takes exactly the drawn hops from it, so the
/// session uses the address that is cached.
pub fn settle(parents: &[Hop], client: Option<SocketAddr>) -> (Option<IpAddr>, Parents) {
    let mut source = None;
    let mut rest: Vec<Hop> = Vec::new();
    for h in pick(parents, &mut random) {
        match h.kind {
            // Only an `extip` before the first hop counts (see `attempt`).
            Kind::ExtIp => {
                if rest.iter().all(|r| r.kind == Kind::Ha) {
                    source = Some(extip(h, client, &mut random));
                }
            }
            _ => rest.push(Hop {
                weight: 1000,
                ..h.clone()
            }),
        }
    }
    let chain = match source {
        Some(ip) => from_source(ip).iter().cloned().chain(rest).collect(),
        None => Arc::from(rest),
    };
    (source, chain)
}

/// `route` (see [`from_source`]) followed by `parents`.
pub fn prepend(route: &Parents, parents: &[Hop]) -> Parents {
    if parents.is_empty() {
        return route.clone();
    }
    route.iter().chain(parents).cloned().collect()
}

/// `base` with the bits after the first `len` replaced by `r`'s.
pub fn random_in_prefix(base: Ipv6Addr, len: u8, r: u128) -> Ipv6Addr {
    let host_mask = if len >= 128 { 0 } else { u128::MAX >> len };
    Ipv6Addr::from((u128::from(base) & !host_mask) | (r & host_mask))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hop(line: &str) -> Result<Hop, String> {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        Hop::parse(&args, |s| {
            crate::net::parse_ip(s).ok_or_else(|| format!("cannot resolve '{s}'"))
        })
    }

    #[test]
    fn parses_parent_lines() {
        let h = hop("1000 socks5+ 10.0.0.1 1080 u p").unwrap();
        assert_eq!(h.kind, Kind::Socks5Plus);
        assert_eq!(h.addr, "10.0.0.1:1080".parse().unwrap());
        assert_eq!(h.host, "10.0.0.1");
        assert_eq!(
            (h.user.as_deref(), h.password.as_deref()),
            (Some("u"), Some("p"))
        );
        for (t, k) in [
            ("tcp", Kind::Tcp),
            ("http", Kind::Http),
            ("connect", Kind::Connect),
            ("connect+", Kind::ConnectPlus),
            ("socks4", Kind::Socks4),
            ("socks4+", Kind::Socks4Plus),
            ("socks4b", Kind::Socks4b),
            ("socks5", Kind::Socks5),
            ("socks5b", Kind::Socks5b),
        ] {
            assert_eq!(hop(&format!("1 {t} 1.2.3.4 1")).unwrap().kind, k);
            assert_eq!(k.name(), t);
        }
        let h = hop("500 extip 2001:db8::/64 0").unwrap();
        assert_eq!((h.kind, h.prefix), (Kind::ExtIp, Some(64)));
        assert!(hop("1000 ha 0.0.0.0 0").is_ok());
    }

    #[test]
    fn refuses_bad_parent_lines() {
        for (line, why) in [
            ("0 tcp 1.2.3.4 1", "weight"),
            ("1001 tcp 1.2.3.4 1", "weight"),
            ("x tcp 1.2.3.4 1", "weight"),
            ("1 gopher 1.2.3.4 1", "unknown parent type"),
            ("1 socks5x 1.2.3.4 1", "unknown parent type"),
            ("1 tlss 0.0.0.0 0", "not a hop to speak TLS to"),
            ("1 extips 1.2.3.4 0", "not a hop to speak TLS to"),
            ("1 socks5ss 1.2.3.4 1", "unknown parent type"),
            ("1 tcp nowhere 1", "cannot resolve"),
            ("1 tcp 1.2.3.4 70000", "bad port"),
            ("1 ha 1.2.3.4 1", "local redirection"),
            ("1 pop3 0.0.0.0 110", "local redirection"),
            ("1 tcp 10.0.0.0/8 1", "prefix"),
            ("1 extip 2001:db8::/129 0", "prefix"),
            ("1 tcp 1.2.3.4", "takes"),
        ] {
            let e = hop(line).unwrap_err();
            assert!(e.contains(why), "{line}: {e}");
        }
    }

    #[test]
    fn a_trailing_s_is_tls_to_that_parent() {
        for (line, kind) in [
            ("1 https 1.2.3.4 1", Kind::Http),
            ("1 tcps 1.2.3.4 1", Kind::Tcp),
            ("1 socks5s 1.2.3.4 1", Kind::Socks5),
            ("1 socks5+s 1.2.3.4 1", Kind::Socks5Plus),
            ("1 connect+s 1.2.3.4 1", Kind::ConnectPlus),
            ("1 connects 1.2.3.4 1", Kind::Connect),
            ("1 socks4bs 1.2.3.4 1", Kind::Socks4b),
        ] {
            let h = hop(line).unwrap();
            assert_eq!((h.kind, h.tls), (kind, true), "{line}");
        }
        assert!(!hop("1 http 1.2.3.4 1").unwrap().tls);
    }

    /// A random source that returns the given draws in turn.
    fn draws(v: &[u32]) -> impl FnMut() -> u32 + '_ {
        let mut i = 0;
        move || {
            i += 1;
            v[(i - 1) % v.len()]
        }
    }

    fn picked(hops: &[Hop], d: &[u32]) -> Vec<String> {
        pick(hops, &mut draws(d))
            .iter()
            .map(|h| h.host.clone())
            .collect()
    }

    fn hops(spec: &[(u32, &str)]) -> Vec<Hop> {
        spec.iter()
            .map(|(w, ip)| hop(&format!("{w} socks5 {ip} 1080")).unwrap())
            .collect()
    }

    #[test]
    fn one_full_weight_parent_is_always_taken() {
        let h = hops(&[(1000, "10.0.0.1")]);
        for d in [0, 500, 999] {
            assert_eq!(picked(&h, &[d]), ["10.0.0.1"]);
        }
    }

    #[test]
    fn a_group_splits_by_weight() {
        let h = hops(&[(300, "10.0.0.1"), (700, "10.0.0.2")]);
        // The first parent covers the top 300 draws, as in 3proxy.
        assert_eq!(picked(&h, &[700]), ["10.0.0.1"]);
        assert_eq!(picked(&h, &[999]), ["10.0.0.1"]);
        assert_eq!(picked(&h, &[699]), ["10.0.0.2"]);
        assert_eq!(picked(&h, &[0]), ["10.0.0.2"]);
    }

    #[test]
    fn groups_form_the_chain() {
        let h = hops(&[
            (1000, "10.0.0.1"),
            (500, "10.0.0.2"),
            (500, "10.0.0.3"),
            (1000, "10.0.0.4"),
        ]);
        assert_eq!(
            picked(&h, &[0, 999, 0]),
            ["10.0.0.1", "10.0.0.2", "10.0.0.4"]
        );
        assert_eq!(picked(&h, &[0, 0, 0]), ["10.0.0.1", "10.0.0.3", "10.0.0.4"]);
    }

    #[test]
    fn a_short_group_may_give_no_hop() {
        let h = hops(&[(1000, "10.0.0.1"), (250, "10.0.0.2")]);
        assert_eq!(picked(&h, &[0, 800]), ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(picked(&h, &[0, 100]), ["10.0.0.1"]);
    }

    #[test]
    fn weights_spread_like_their_share() {
        let h = hops(&[(250, "10.0.0.1"), (750, "10.0.0.2")]);
        let mut n = 0u32;
        let mut seq = 0u32;
        let mut rand = || {
            seq = seq.wrapping_add(7919);
            seq
        };
        let mut first = 0;
        for _ in 0..4000 {
            if pick(&h, &mut rand)[0].host == "10.0.0.1" {
                first += 1;
            }
            n += 1;
        }
        let share = f64::from(first) / f64::from(n);
        assert!((0.2..0.3).contains(&share), "share {share}");
    }

    #[test]
    fn avoided_hops_are_left_out_while_their_group_has_others() {
        let h = hops(&[(300, "10.0.0.1"), (700, "10.0.0.2"), (1000, "10.0.0.3")]);
        let not_1 = |x: &Hop| x.host == "10.0.0.1";
        // The draw lands on .1: drawn again among the rest of its group.
        let got: Vec<_> = pick_avoiding(&h, &mut draws(&[999, 5, 0]), not_1)
            .iter()
            .map(|x| x.host.clone())
            .collect();
        assert_eq!(got, ["10.0.0.2", "10.0.0.3"]);
        // A draw on a hop not avoided is what pick gives.
        assert_eq!(
            pick_avoiding(&h, &mut draws(&[0, 0]), not_1)[0].host,
            "10.0.0.2"
        );
        // All of a group avoided: drawn as today.
        let all = |x: &Hop| x.host != "10.0.0.3";
        assert_eq!(
            pick_avoiding(&h, &mut draws(&[999, 0]), all)[0].host,
            "10.0.0.1"
        );
        // No hop for a short group's gap, avoided or not.
        let short = hops(&[(1000, "10.0.0.1"), (250, "10.0.0.2")]);
        assert_eq!(
            pick_avoiding(&short, &mut draws(&[0, 100]), |x: &Hop| x.host
                == "10.0.0.2")
            .len(),
            1
        );
        // Over many draws, an avoided hop is never taken and the others
        // keep their shares.
        let three = hops(&[(333, "10.0.0.1"), (333, "10.0.0.2"), (334, "10.0.0.3")]);
        let mut seq = 0u32;
        let mut rand = || {
            seq = seq.wrapping_add(7919);
            seq
        };
        let mut n2 = 0;
        for _ in 0..3000 {
            let got = pick_avoiding(&three, &mut rand, |x: &Hop| x.host == "10.0.0.1");
            assert_ne!(got[0].host, "10.0.0.1");
            if got[0].host == "10.0.0.2" {
                n2 += 1;
            }
        }
        assert!((1300..1700).contains(&n2), "{n2}");
    }

    #[test]
    fn prefixes_keep_the_network_bits() {
        let base: Ipv6Addr = "2001:db8:1:2::".parse().unwrap();
        let a = random_in_prefix(base, 64, u128::MAX);
        assert_eq!(
            a,
            "2001:db8:1:2:ffff:ffff:ffff:ffff"
                .parse::<Ipv6Addr>()
                .unwrap()
        );
        let a = random_in_prefix(base, 128, u128::MAX);
        assert_eq!(a, base);
        let a = random_in_prefix(base, 0, 5);
        assert_eq!(a, "::5".parse::<Ipv6Addr>().unwrap());
    }

    #[test]
    fn local_redirections_take_every_tcp_handler_but_dns() {
        for (_, k) in KINDS {
            let tcp = !matches!(k, Kind::Dns | Kind::ExtIp | Kind::Ha);
            assert_eq!(takes_tcp(*k), tcp, "{}", k.name());
            assert_eq!(k.handler().is_some(), tcp, "{}", k.name());
        }
        let h = |kind| Handoff {
            kind,
            hops: 1,
            early: b"x".to_vec(),
            dest: None,
        };
        assert_eq!(check_handoff(&h(Kind::Dns)), Err(Res::NOTIMPL));
        assert_eq!(check_handoff(&h(Kind::Pop3)), Ok(()));
        assert_eq!(Kind::Connect.handler(), Some("proxy"));
        assert_eq!(Kind::Socks4b.handler(), Some("socks"));
    }

    #[test]
    fn only_a_redirected_client_skips_local_redirections() {
        let local = vec![hop("1000 pop3 0.0.0.0 0").unwrap()];
        let remote = vec![hop("1000 socks5 1.2.3.4 1080").unwrap()];
        assert!(skip_on_redirect(&local, true));
        assert!(!skip_on_redirect(&local, false));
        assert!(!skip_on_redirect(&remote, true));
        assert!(!skip_on_redirect(&[], true));
    }

    #[test]
    fn a_known_destination_is_named_or_its_address() {
        let addr: SocketAddr = "192.0.2.1:110".parse().unwrap();
        let named = Known {
            name: Some("mail.example".into()),
            addr,
        };
        assert_eq!(named.host(), "mail.example");
        assert_eq!(Known { name: None, addr }.host(), "192.0.2.1");
    }
}
