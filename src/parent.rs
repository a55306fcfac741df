//! Parent proxies: the `parent` chain of an `allow` entry (3proxy's
//! redirect.c: `handleredirect` picks the hops, `clientnegotiate` talks to
//! each; 3proxy.cfg(5) "parent").
//!
//! Two steps, kept apart so the first can be tested without sockets:
//! - [`pick`] chooses the hops of one attempt. Consecutive parents form a
//!   group until their weights reach 1000; one parent of each group is
//!   taken with probability weight/1000 (a group short of 1000 may give
//!   none), and the groups, in cfg order, form the chain. The random
//!   source is passed in.
//! - [`connect`] dials the first hop and asks each hop in turn to connect
//!   to the next one, the last one to the destination, each step taking
//!   the stream made so far and giving it back (ureq's connector chain).
//!   It makes up to `parentretries` attempts, each with a fresh pick.
//!
//! Failures are 3proxy's codes: 30-39 an HTTP CONNECT parent, 40-49 a
//! SOCKS4 parent, 50-59 a SOCKS5 parent, 60+REP a SOCKS5 refusal; a
//! failure to reach the first hop keeps its own code (11-13).
//!
//! Every read and write of a handshake has the CHAIN timeout; the dial of
//! the first hop has the CONNECT timeout.

use std::cell::{Cell, RefCell};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::client::Client;
use crate::conf::token::quote;
use crate::net::{Dialer, Stream};
use crate::res::Res;
use crate::service::Service;
use crate::socks::{self, Dest};
use crate::timeouts::Timeouts;

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
    fn sends_name(self) -> bool {
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
        match &t[name.len()..] {
            "" => {}
            "s" => {
                return Err(format!(
                    "'{}': TLS to parents is not supported yet",
                    quote(t)
                ))
            }
            _ => return Err(format!("unknown parent type '{}'", quote(t))),
        }
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
        })
    }

    /// `0.0.0.0 0`: not a proxy to dial, a handler in this process.
    fn is_local(&self) -> bool {
        self.addr.ip().is_unspecified() && self.addr.port() == 0
    }

    /// Counted in `%h` (3proxy counts every hop but `extip` and `ha`).
    fn counts(&self) -> bool {
        !matches!(self.kind, Kind::ExtIp | Kind::Ha)
    }
}

// --- Local redirection --------------------------------------------------
//
// `parent W TYPE 0.0.0.0 0` does not dial: the client is handed to the
// handler of TYPE in this process (3proxy's `redirs[]` table and its
// childfunc loop). The service that met the redirection says "granted"
// in its own protocol where it has one, calls [`hand_over`] and returns;
// its `serve` then ends with [`serve_handoffs`], which runs the target
// handler on the same thread and client. Handlers never call one another,
// so a chain of hand-offs does not deepen the (small) client stack, and
// [`MAX_HANDOFFS`] stops a chain that would go round for ever.

thread_local! {
    /// Set while this thread serves a client handed over by a local
    /// redirection (3proxy's `param->redirected` on the second pass).
    static REDIRECTED: Cell<bool> = const { Cell::new(false) };
    /// The hops the hand-offs so far took (`%h` before the target's own).
    static LOCAL_HOPS: Cell<u32> = const { Cell::new(0) };
    /// A hand-off asked for and not yet served.
    static PENDING: RefCell<Option<Handoff>> = const { RefCell::new(None) };
}

/// Marks the current thread's client as locally redirected until dropped.
pub struct Redirected(bool);

impl Redirected {
    pub fn enter() -> Redirected {
        Redirected(REDIRECTED.with(|r| r.replace(true)))
    }
}

impl Drop for Redirected {
    fn drop(&mut self) {
        let was = self.0;
        REDIRECTED.with(|r| r.set(was));
    }
}

/// 3proxy's rule for the handler a client was redirected to: an ACL entry
/// whose first parent is a local redirection (`0.0.0.0 0`) is skipped, so
/// the request is not sent round the same redirection again.
pub fn skip_on_redirect(parents: &[Hop]) -> bool {
    REDIRECTED.with(|r| r.get()) && parents.first().is_some_and(Hop::is_local)
}

/// Hops taken by the local redirections that brought the client to the
/// handler serving it now (0 when none did). A handler that dials adds
/// its own chain's hops to these for `%h`.
pub fn local_hops() -> u32 {
    LOCAL_HOPS.with(|h| h.get())
}

/// Hand-offs one client may take; one more ends the session with
/// [`REDIRECTION_LOOP`] (3proxy allows 16 handlers per client, too).
pub const MAX_HANDOFFS: u32 = 15;
/// 3proxy's code for a client sent round local redirections too often.
pub const REDIRECTION_LOOP: Res = Res::REDIRECTION_LOOP;

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

/// Ask for the client to be handed over once the current handler returns.
/// Err NOTIMPL for `dns`: its handler serves UDP datagrams, not a TCP
/// client (nothing is scheduled; the caller refuses the client).
pub fn hand_over(h: Handoff) -> Result<(), Res> {
    if !takes_tcp(h.kind) {
        log::warn!(
            "a TCP client cannot be redirected locally to '{}': that handler is UDP only",
            h.kind.name()
        );
        return Err(Res::NOTIMPL);
    }
    PENDING.with(|p| *p.borrow_mut() = Some(h));
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

/// Serve the hand-offs the handler that just returned asked for, one
/// after another (3proxy's childfunc loop). Called at the end of the
/// `serve` of each service that can hand clients over.
pub fn serve_handoffs(c: &mut Client) {
    let Some(mut next) = PENDING.with(|p| p.borrow_mut().take()) else {
        return;
    };
    let _redirected = Redirected::enter();
    let hops_before = local_hops();
    let mut hops = hops_before;
    let mut taken = 0;
    loop {
        taken += 1;
        hops += next.hops;
        // What the first handler learned is not the next one's record;
        // `%N` stays (3proxy keeps the service, SOCK5 after a SOCKS5
        // handshake).
        c.text.clear();
        c.req_host = None;
        c.req_addr = None;
        c.remote_addr = None;
        c.ext_addr = None;
        c.res = Res::OK;
        c.logged = false;
        c.hops = hops;
        if taken > MAX_HANDOFFS {
            c.res = REDIRECTION_LOOP;
            c.text = "local redirection loop".into();
            PENDING.with(|p| p.borrow_mut().take());
            break;
        }
        LOCAL_HOPS.with(|h| h.set(hops));
        run_handler(c, next);
        match PENDING.with(|p| p.borrow_mut().take()) {
            Some(h) => next = h,
            None => break,
        }
    }
    LOCAL_HOPS.with(|h| h.set(hops_before));
}

/// The handler of a local redirection's type (3proxy's `redirs[]`).
fn run_handler(c: &mut Client, h: Handoff) {
    use crate::services::{admin, ftppr, imapp, pop3p, proxy, smtpp, socks, tcppm, tlspr};
    let early = &h.early[..];
    let dest = h.dest.as_ref();
    match h.kind {
        Kind::Tcp => tcppm::serve_redirected(c, early, dest),
        Kind::Http | Kind::Connect | Kind::ConnectPlus => proxy::serve_after(c, early),
        Kind::Socks4
        | Kind::Socks4Plus
        | Kind::Socks4b
        | Kind::Socks5
        | Kind::Socks5Plus
        | Kind::Socks5b => socks::serve_redirected(c, early),
        Kind::Pop3 => pop3p::serve_redirected(c, early, dest),
        Kind::Imap => imapp::serve_redirected(c, early, dest),
        Kind::Smtp => smtpp::serve_redirected(c, early, dest),
        Kind::Ftp => ftppr::serve_redirected(c, early, dest),
        Kind::Admin => admin::serve_redirected(c, early),
        Kind::Tls => tlspr::serve_redirected(c, early, dest),
        // Refused by `hand_over`; never scheduled.
        Kind::Dns | Kind::ExtIp | Kind::Ha => c.res = Res::NOTIMPL,
    }
}

/// Choose the hops of one attempt (3proxy's `handleredirect` loop).
/// `rand` gives uniformly random numbers; only their value mod 1000 is
/// used.
pub fn pick<'a>(hops: &'a [Hop], rand: &mut impl FnMut() -> u32) -> Vec<&'a Hop> {
    let mut out = Vec::new();
    // What is left of the current group's 1000, and the draw for it.
    let mut left: i64 = 1000;
    let mut draw = i64::from(rand() % 1000);
    let mut taken = false;
    for h in hops {
        left -= i64::from(h.weight);
        // This hop covers the draws in [left, left + weight).
        if !taken && left <= draw {
            out.push(h);
            taken = true;
        }
        if left <= 0 {
            // The group is full: the next parent starts a new one.
            left += 1000;
            taken = false;
            draw = i64::from(rand() % 1000);
        }
    }
    out
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

/// What the chain must reach, and on whose behalf.
#[derive(Debug, Clone, Default)]
pub struct Want<'a> {
    /// The destination, resolved (the `+` types send `host` instead).
    pub addr: Option<SocketAddr>,
    /// The host name the client asked for, if it gave one.
    pub host: Option<&'a str>,
    /// The client's own credentials, for parents whose user is `*`.
    pub user: Option<&'a str>,
    pub password: Option<&'a str>,
    /// The client's address and the one it reached us on: the PROXY
    /// header of `ha`, and `extip 0.0.0.0` (use the client's address).
    pub client: Option<SocketAddr>,
    pub local: Option<SocketAddr>,
    /// We send at once when connected (the `proxy` service with an HTTP
    /// request in hand), so a direct connection may hold the handshake's
    /// last ACK back for our first bytes ([`Dialer::connect_ip_to_send`]).
    pub sends_first: bool,
}

impl Want<'_> {
    fn dest(&self, by_name: bool) -> Result<Dest, Res> {
        let addr = self.addr.ok_or(Res::NOHOST)?;
        Ok(match self.host {
            Some(h) if by_name => Dest::Name(h.to_string(), addr.port()),
            _ => Dest::Addr(addr),
        })
    }
}

/// Where a request goes after the chain.
#[derive(Debug)]
pub enum Route {
    /// A stream to relay: to the destination, or to a `tcp`/`http`
    /// parent.
    Stream(Chain),
    /// A local redirection (`parent 1000 http 0.0.0.0 0`): hand the client
    /// to the handler of `kind` in this process (`http` is `proxy`; see
    /// [`hand_over`]). `hops` counts the redirection.
    Local { kind: Kind, hops: u32 },
}

/// A connected chain.
#[derive(Debug)]
pub struct Chain {
    pub stream: Stream,
    /// Parents taken (`%h`).
    pub hops: u32,
    /// The last parent is an `http` one: the `proxy` service must send
    /// requests in absolute form, with `credentials` as
    /// `Proxy-Authorization: Basic` (see [`basic_auth`]). Other services
    /// relay the stream as it is.
    pub http_parent: bool,
    /// The credentials for the last `tcp`/`http` parent, if it has any.
    pub credentials: Option<(String, String)>,
}

/// Reach `want` through `parents` for a client of `svc`: directly when
/// the list is empty (or a pick takes no hop), else through the chain,
/// with up to `parentretries` attempts. Err: the last attempt's code.
pub fn connect(svc: &Service, parents: &[Hop], want: &Want<'_>) -> Result<Route, Res> {
    if parents.is_empty() {
        let addr = want.addr.ok_or(Res::NOHOST)?;
        let stream = if want.sends_first {
            svc.dialer.connect_ip_to_send(addr)?
        } else {
            svc.dialer.connect_ip(addr)?
        };
        return Ok(Route::Stream(Chain {
            stream,
            hops: 0,
            http_parent: false,
            credentials: None,
        }));
    }
    let chain_to = svc.timeouts.get(Timeouts::CHAIN);
    let mut last = Res::PARENT_SOCKS5_REP;
    for _ in 0..RETRIES.load(Ordering::Relaxed).max(1) {
        let hops = pick(parents, &mut random);
        match attempt(&svc.dialer, chain_to, &hops, want, &mut random, false) {
            Ok(Reached::Route(r)) => return Ok(r),
            Ok(Reached::Udp(_)) => return Err(Res::PARENT_INTERNAL),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// A UDP association made with the chain's last hop (a `socks5` or
/// `socks5+` parent): the control connection runs through the hops before
/// it like a CONNECT chain, and the datagrams, each with its SOCKS5 UDP
/// header, go straight to the relay address the last hop gave.
#[derive(Debug)]
pub struct UdpChain {
    /// The association lives as long as this connection.
    pub control: Stream,
    /// The parent's UDP relay.
    pub relay: SocketAddr,
    /// Parents taken (`%h`).
    pub hops: u32,
    /// The source address an `extip` hop set, if any.
    pub source: Option<IpAddr>,
}

/// Negotiate a UDP ASSOCIATE through `parents` (3proxy's UDP chaining,
/// one UDP hop): Ok(None) when the pick took no hop (relay directly).
/// Err 70 when the last hop cannot relay UDP (not `socks5`/`socks5+`, a
/// `tcp`/`http` parent, a local redirection).
pub fn udp_associate(
    svc: &Service,
    parents: &[Hop],
    want: &Want<'_>,
) -> Result<Option<UdpChain>, Res> {
    if parents.is_empty() {
        return Ok(None);
    }
    let chain_to = svc.timeouts.get(Timeouts::CHAIN);
    let mut last = Res::PARENT_NO_UDP;
    for _ in 0..RETRIES.load(Ordering::Relaxed).max(1) {
        let hops = pick(parents, &mut random);
        match attempt(&svc.dialer, chain_to, &hops, want, &mut random, true) {
            Ok(Reached::Udp(u)) => return Ok(u),
            Ok(Reached::Route(_)) => return Err(Res::PARENT_NO_UDP),
            // Not a failure another pick would mend the same way, but a
            // pick may take another type: try again like any failure.
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// What one attempt reached.
enum Reached {
    Route(Route),
    /// UDP mode: the association, or None for no hop.
    Udp(Option<UdpChain>),
}

/// The credentials a hop sends: its own, the client's for `*`, or none.
/// Err 4 when `*` asks for the client's and the client gave none.
fn credentials(h: &Hop, want: &Want<'_>) -> Result<Option<(String, String)>, Res> {
    match h.user.as_deref() {
        None => Ok(None),
        Some("*") => match want.user {
            Some(u) => Ok(Some((
                u.to_string(),
                want.password.unwrap_or("").to_string(),
            ))),
            None => Err(Res::AUTH_NO_USER),
        },
        Some(u) => Ok(Some((
            u.to_string(),
            h.password.clone().unwrap_or_default(),
        ))),
    }
}

/// One attempt along the hops of one pick.
fn attempt(
    dialer: &Dialer,
    chain_to: Duration,
    hops: &[&Hop],
    want: &Want<'_>,
    rand: &mut impl FnMut() -> u32,
    udp: bool,
) -> Result<Reached, Res> {
    let mut source: Option<IpAddr> = None;
    let mut ha = false;
    let mut count = 0u32;
    // The stream so far and the hop at its end.
    let mut at: Option<(Stream, &Hop)> = None;
    for &h in hops {
        if h.counts() {
            count += 1;
        }
        if udp && matches!(h.kind, Kind::Tcp | Kind::Http) {
            // They end the chain with a byte stream: no UDP there.
            return Err(Res::PARENT_NO_UDP);
        }
        if at.is_none() {
            match h.kind {
                Kind::ExtIp => {
                    source = Some(extip(h, want, rand));
                    continue;
                }
                Kind::Ha => {
                    ha = true;
                    continue;
                }
                _ if h.is_local() && udp => return Err(Res::PARENT_NO_UDP),
                _ if h.is_local() => {
                    // A user and password on a local redirection are not
                    // passed on (the next handler takes the client's own),
                    // but `*` still needs the client to have given some,
                    // as in 3proxy.
                    credentials(h, want)?;
                    return Ok(Reached::Route(Route::Local {
                        kind: h.kind,
                        hops: count,
                    }));
                }
                _ => {}
            }
            // The first hop: 0.0.0.0 keeps the requested address, port 0
            // the requested port.
            let mut addr = h.addr;
            if addr.ip().is_unspecified() {
                addr.set_ip(want.addr.ok_or(Res::NOHOST)?.ip());
            }
            if addr.port() == 0 {
                addr.set_port(want.addr.ok_or(Res::NOHOST)?.port());
            }
            // We speak first to a parent that negotiates and to any peer
            // that gets a PROXY header; a `tcp` parent may forward to a
            // server that speaks first, an `http` one gets what the
            // client sends, whenever it does.
            let first = ha || want.sends_first || !matches!(h.kind, Kind::Tcp | Kind::Http);
            let s = dial(dialer, source, addr, first)?;
            if ha {
                send_proxy_header(&s, chain_to, want)?;
            }
            at = Some((s, h));
        } else if let Some((s, prev)) = &at {
            if matches!(h.kind, Kind::ExtIp | Kind::Ha) {
                // Only meaningful before the first hop (as in 3proxy).
                continue;
            }
            let next = if prev.kind.sends_name() {
                Dest::Name(h.host.clone(), h.addr.port())
            } else {
                Dest::Addr(h.addr)
            };
            negotiate(prev, s, chain_to, &next, want)?;
            at = Some((at.take().map(|(s, _)| s).ok_or(Res::PARENT_INTERNAL)?, h));
        }
        // `tcp` and `http` parents end the chain (and cannot carry UDP).
        if let Some((_, last)) = &at {
            if matches!(last.kind, Kind::Tcp | Kind::Http) {
                break;
            }
        }
    }
    if udp {
        let Some((control, last)) = at else {
            // No hop (an `extip` alone does not apply to UDP).
            return Ok(Reached::Udp(None));
        };
        if !matches!(last.kind, Kind::Socks5 | Kind::Socks5Plus) {
            return Err(Res::PARENT_NO_UDP);
        }
        let creds = credentials(last, want)?;
        let _ = control.set_timeout(Some(chain_to));
        let mut relay = socks5_udp(&control, creds.as_ref())?;
        if relay.ip().is_unspecified() {
            // "Same address as the control connection" (RFC 1928 leaves
            // it open; most servers mean their own address).
            relay.set_ip(last.addr.ip());
        }
        let _ = control.set_timeout(None);
        return Ok(Reached::Udp(Some(UdpChain {
            control,
            relay,
            hops: count,
            source,
        })));
    }
    let Some((stream, last)) = at else {
        // No hop picked: straight to the destination.
        let addr = want.addr.ok_or(Res::NOHOST)?;
        let s = dial(dialer, source, addr, ha || want.sends_first)?;
        if ha {
            send_proxy_header(&s, chain_to, want)?;
        }
        return Ok(Reached::Route(Route::Stream(Chain {
            stream: s,
            hops: count,
            http_parent: false,
            credentials: None,
        })));
    };
    let mut credentials_out = None;
    if matches!(last.kind, Kind::Tcp | Kind::Http) {
        credentials_out = credentials(last, want)?;
    } else {
        let dest = want.dest(last.kind.sends_name())?;
        negotiate(last, &stream, chain_to, &dest, want)?;
    }
    Ok(Reached::Route(Route::Stream(Chain {
        stream,
        hops: count,
        http_parent: last.kind == Kind::Http,
        credentials: credentials_out,
    })))
}

/// Dial `addr`, from `source` if an `extip` set one; `first`: we send at
/// once (see [`Dialer::connect_ip_to_send`]).
fn dial(
    dialer: &Dialer,
    source: Option<IpAddr>,
    addr: SocketAddr,
    first: bool,
) -> Result<Stream, Res> {
    let open = |d: &Dialer| {
        if first {
            d.connect_ip_to_send(addr)
        } else {
            d.connect_ip(addr)
        }
    };
    match source {
        None => open(dialer),
        Some(ip) => {
            let mut d = dialer.clone();
            // An `extip` address need not be configured here (yet).
            d.freebind = true;
            if ip.is_ipv4() {
                d.ext4 = Some(ip);
            } else {
                d.ext6 = Some(ip);
            }
            open(&d)
        }
    }
}

/// The source address an `extip` hop gives: its address; the client's
/// for 0.0.0.0; a random one inside an IPv6 prefix.
fn extip(h: &Hop, want: &Want<'_>, rand: &mut impl FnMut() -> u32) -> IpAddr {
    let ip = h.addr.ip();
    if ip.is_unspecified() {
        if let Some(c) = want.client {
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
    }])
}

/// For `authcache ext`: draw the hops of an attempt now, with the source
/// address its `extip` hops give (3proxy draws while it checks the ACL
/// and caches what the draw set). Returns that source (None when the draw
/// set none) and a chain that takes exactly the drawn hops from it, so the
/// session uses the address that is cached.
pub fn settle(parents: &[Hop], client: Option<SocketAddr>) -> (Option<IpAddr>, Parents) {
    let want = Want {
        client,
        ..Want::default()
    };
    let mut source = None;
    let mut rest: Vec<Hop> = Vec::new();
    for h in pick(parents, &mut random) {
        match h.kind {
            // Only an `extip` before the first hop counts (see `attempt`).
            Kind::ExtIp => {
                if rest.iter().all(|r| r.kind == Kind::Ha) {
                    source = Some(extip(h, &want, &mut random));
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

/// `ha`: the PROXY protocol v1 line for the client's connection.
fn send_proxy_header(s: &Stream, chain_to: Duration, want: &Want<'_>) -> Result<(), Res> {
    let (Some(cli), Some(srv)) = (want.client, want.local) else {
        return Err(Res::PARENT_HA_SEND);
    };
    let line = proxy_v1_line(cli, srv);
    let _ = s.set_timeout(Some(chain_to));
    let mut w = s;
    w.write_all(line.as_bytes())
        .map_err(|_| Res::PARENT_HA_SEND)
}

/// `PROXY TCP4|TCP6 SRC DST SPORT DPORT\r\n`.
pub fn proxy_v1_line(client: SocketAddr, local: SocketAddr) -> String {
    let fam = if client.is_ipv4() { "TCP4" } else { "TCP6" };
    format!(
        "PROXY {fam} {} {} {} {}\r\n",
        client.ip(),
        local.ip(),
        client.port(),
        local.port()
    )
}

/// Ask the parent `h` at the end of `s` to connect to `dest`.
fn negotiate(
    h: &Hop,
    s: &Stream,
    chain_to: Duration,
    dest: &Dest,
    want: &Want<'_>,
) -> Result<(), Res> {
    let creds = credentials(h, want)?;
    let _ = s.set_timeout(Some(chain_to));
    match h.kind {
        Kind::Connect | Kind::ConnectPlus => http_connect(s, dest, creds.as_ref()),
        Kind::Socks4 | Kind::Socks4Plus | Kind::Socks4b => {
            socks4_connect(s, dest, creds.as_ref(), h.kind == Kind::Socks4b)
        }
        Kind::Socks5 | Kind::Socks5Plus | Kind::Socks5b => {
            socks5_connect(s, dest, creds.as_ref(), h.kind == Kind::Socks5b)
        }
        // tcp and http relay as they are; the rest never get here.
        _ => Ok(()),
    }
}

fn send(mut s: &Stream, b: &[u8], code: Res) -> Result<(), Res> {
    s.write_all(b).map_err(|_| code)
}

fn recv(mut s: &Stream, b: &mut [u8], code: Res) -> Result<(), Res> {
    s.read_exact(b).map_err(|_| code)
}

/// `CONNECT host:port HTTP/1.0`; any 2xx status is success.
fn http_connect(s: &Stream, dest: &Dest, creds: Option<&(String, String)>) -> Result<(), Res> {
    let target = match dest {
        Dest::Name(n, p) if n.contains(':') => format!("[{n}]:{p}"),
        Dest::Name(n, p) => format!("{n}:{p}"),
        Dest::Addr(a) => a.to_string(),
    };
    let mut req = format!("CONNECT {target} HTTP/1.0\r\nConnection: keep-alive\r\n");
    if let Some((u, p)) = creds {
        req.push_str(&format!(
            "Proxy-Authorization: Basic {}\r\n",
            basic_auth(u, p)
        ));
    }
    req.push_str("\r\n");
    send(s, req.as_bytes(), Res::PARENT_CONNECT_SEND)?;
    // Byte by byte: what follows the header belongs to the tunnel.
    let status = read_line(s, Res::PARENT_CONNECT_REPLY)?;
    if status.len() < 12 || !status.starts_with(b"HTTP/") {
        return Err(Res::PARENT_CONNECT_REPLY);
    }
    if status[9] != b'2' {
        return Err(Res::PARENT_CONNECT_REFUSED);
    }
    let mut total = status.len();
    loop {
        let line = read_line(s, Res::PARENT_CONNECT_HEAD)?;
        total += line.len();
        if line.is_empty() {
            return Ok(());
        }
        if total > MAX_REPLY_HEAD {
            return Err(Res::PARENT_CONNECT_HEAD);
        }
    }
}

/// The most a CONNECT parent may send before its blank line.
const MAX_REPLY_HEAD: usize = 16 * 1024;

/// One line without its CR LF; `code` on EOF, error or a line too long.
fn read_line(mut s: &Stream, code: Res) -> Result<Vec<u8>, Res> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b) {
            Ok(1) if b[0] == b'\n' => {
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
            Ok(1) if line.len() < MAX_REPLY_HEAD => line.push(b[0]),
            _ => return Err(code),
        }
    }
}

fn socks4_connect(
    s: &Stream,
    dest: &Dest,
    creds: Option<&(String, String)>,
    short: bool,
) -> Result<(), Res> {
    let userid = creds.map_or("anonymous", |(u, _)| u.as_str());
    let req = socks::v4_connect(dest, userid)?;
    send(s, &req, Res::PARENT_SOCKS4_SEND)?;
    let mut r = [0u8; 8];
    let n = if short { 3 } else { 8 };
    recv(s, &mut r[..n], Res::PARENT_SOCKS4_SHORT)?;
    if r[1] != socks::V4_GRANTED {
        return Err(Res::PARENT_SOCKS4_REFUSED);
    }
    Ok(())
}

/// The SOCKS5 greeting and, if the parent picks it, RFC 1929.
fn socks5_hello(s: &Stream, creds: Option<&(String, String)>) -> Result<(), Res> {
    send(
        s,
        &socks::v5_greeting(creds.is_some()),
        Res::PARENT_SOCKS5_SEND,
    )?;
    let mut r = [0u8; 4];
    recv(s, &mut r[..2], Res::PARENT_SOCKS5_NO_GREETING)?;
    if r[0] != 5 {
        return Err(Res::PARENT_SOCKS5_NOT_V5);
    }
    match (r[1], creds) {
        (socks::METHOD_NONE, _) => {}
        (socks::METHOD_USERPASS, Some((u, p))) => {
            send(s, &socks::v5_userpass(u, p), Res::PARENT_SOCKS5_SEND)?;
            recv(s, &mut r[..2], Res::PARENT_SOCKS5_NO_AUTH_REPLY)?;
            if r[..2] != [1, 0] {
                return Err(Res::PARENT_SOCKS5_AUTH_REFUSED);
            }
        }
        _ => return Err(Res::PARENT_SOCKS5_NO_METHOD),
    }
    Ok(())
}

fn socks5_connect(
    s: &Stream,
    dest: &Dest,
    creds: Option<&(String, String)>,
    short: bool,
) -> Result<(), Res> {
    socks5_hello(s, creds)?;
    let mut r = [0u8; 4];
    send(
        s,
        &socks::v5_request(socks::CMD_CONNECT, dest)?,
        Res::PARENT_SOCKS5_SEND,
    )?;
    recv(s, &mut r, Res::PARENT_SOCKS5_NO_REPLY)?;
    if r[0] != 5 {
        return Err(Res::PARENT_SOCKS5_NOT_V5);
    }
    if r[1] != 0 {
        return Err(Res::parent_socks5_rep(r[1]));
    }
    let mut len = [0u8; 1];
    if r[3] == socks::ATYP_NAME {
        recv(s, &mut len, Res::PARENT_SOCKS5_SHORT_REPLY)?;
    }
    let rest = socks::v5_reply_rest(r[3], len[0]).ok_or(Res::PARENT_SOCKS5_BAD_ATYP)?;
    if short && r[3] == socks::ATYP_V4 {
        // socks5b: a parent known to send only the first 4 bytes.
        return Ok(());
    }
    let mut skip = [0u8; 257];
    recv(s, &mut skip[..rest], Res::PARENT_SOCKS5_SHORT_REPLY)
}

/// UDP ASSOCIATE at a SOCKS5 parent, from any address (0.0.0.0:0, as
/// 3proxy asks); the reply's address is the parent's UDP relay.
fn socks5_udp(s: &Stream, creds: Option<&(String, String)>) -> Result<SocketAddr, Res> {
    socks5_hello(s, creds)?;
    let any = Dest::Addr(SocketAddr::new(
        IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        0,
    ));
    send(
        s,
        &socks::v5_request(socks::CMD_UDP, &any)?,
        Res::PARENT_SOCKS5_SEND,
    )?;
    let mut r = [0u8; 4];
    recv(s, &mut r, Res::PARENT_SOCKS5_NO_REPLY)?;
    if r[0] != 5 {
        return Err(Res::PARENT_SOCKS5_NOT_V5);
    }
    if r[1] != 0 {
        return Err(Res::parent_socks5_rep(r[1]));
    }
    let mut a = [0u8; 18];
    let ip = match r[3] {
        socks::ATYP_V4 => {
            recv(s, &mut a[..6], Res::PARENT_SOCKS5_SHORT_REPLY)?;
            IpAddr::from([a[0], a[1], a[2], a[3]])
        }
        socks::ATYP_V6 => {
            recv(s, &mut a, Res::PARENT_SOCKS5_SHORT_REPLY)?;
            let mut o = [0u8; 16];
            o.copy_from_slice(&a[..16]);
            a.copy_within(16..18, 4);
            IpAddr::from(o)
        }
        // A relay given by name cannot be used.
        _ => return Err(Res::PARENT_SOCKS5_BAD_ATYP),
    };
    Ok(SocketAddr::new(ip, u16::from_be_bytes([a[4], a[5]])))
}

/// base64 of `user:password`, for `Proxy-Authorization: Basic`.
pub fn basic_auth(user: &str, password: &str) -> String {
    crate::http::base64_encode(format!("{user}:{password}").as_bytes())
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
            ("1 socks5s 1.2.3.4 1", "not supported yet"),
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
    fn basic_auth_is_base64() {
        assert_eq!(
            basic_auth("Aladdin", "open sesame"),
            "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        assert_eq!(basic_auth("a", ""), "YTo=");
        assert_eq!(basic_auth("ab", "c"), "YWI6Yw==");
        assert_eq!(basic_auth("", "ab"), "OmFi");
    }

    #[test]
    fn proxy_v1_lines() {
        assert_eq!(
            proxy_v1_line("1.2.3.4:5".parse().unwrap(), "6.7.8.9:10".parse().unwrap()),
            "PROXY TCP4 1.2.3.4 6.7.8.9 5 10\r\n"
        );
        assert_eq!(
            proxy_v1_line("[::1]:5".parse().unwrap(), "[::2]:10".parse().unwrap()),
            "PROXY TCP6 ::1 ::2 5 10\r\n"
        );
    }

    #[test]
    fn extip_sources_bind_with_freebind() {
        // 192.0.2.1 (TEST-NET-1) is not an address of this host: a plain
        // bind fails (12); with IP_FREEBIND the bind succeeds and only the
        // connect fails, as the peer cannot answer that address.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let to = l.local_addr().unwrap();
        let src: IpAddr = "192.0.2.1".parse().unwrap();
        let plain = Dialer {
            ext4: Some(src),
            timeout: Duration::from_millis(300),
            ..Dialer::default()
        };
        assert_eq!(plain.connect_ip(to).unwrap_err(), Res::BIND);
        let r = dial(&plain, Some(src), to, false);
        assert_ne!(r.map(|_| ()).unwrap_err(), Res::BIND);
    }

    #[test]
    fn local_redirections_take_every_tcp_handler_but_dns() {
        for (_, k) in KINDS {
            let tcp = !matches!(k, Kind::Dns | Kind::ExtIp | Kind::Ha);
            assert_eq!(takes_tcp(*k), tcp, "{}", k.name());
        }
        let h = |kind| Handoff {
            kind,
            hops: 1,
            early: b"x".to_vec(),
            dest: None,
        };
        assert_eq!(hand_over(h(Kind::Dns)), Err(Res::NOTIMPL));
        assert!(PENDING.with(|p| p.borrow().is_none()));
        assert_eq!(hand_over(h(Kind::Pop3)), Ok(()));
        let got = PENDING.with(|p| p.borrow_mut().take()).unwrap();
        assert_eq!((got.kind, got.early.as_slice()), (Kind::Pop3, &b"x"[..]));
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

    #[test]
    fn star_passes_the_clients_credentials() {
        let h = hop("1000 socks5 1.2.3.4 1 * *").unwrap();
        let want = Want {
            user: Some("alice"),
            password: Some("pw"),
            ..Want::default()
        };
        assert_eq!(
            credentials(&h, &want).unwrap(),
            Some(("alice".into(), "pw".into()))
        );
        assert_eq!(credentials(&h, &Want::default()).unwrap_err(), Res(4));
        let h = hop("1000 socks5 1.2.3.4 1 bob").unwrap();
        assert_eq!(
            credentials(&h, &want).unwrap(),
            Some(("bob".into(), String::new()))
        );
    }
}
