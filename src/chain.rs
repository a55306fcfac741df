//! The chain client: reaching a destination through the `parent` hops an
//! ACL entry gave (3proxy's redirect.c `clientnegotiate`; 3proxy.cfg(5)
//! "parent"). [`connect`] dials the first hop and asks each hop in turn to
//! connect to the next one, the last one to the destination, each step
//! taking the stream made so far and giving it back (ureq's connector
//! chain); it makes up to `parentretries` attempts, each with a fresh
//! pick (`parent::pick`, pure). The handshakes themselves are wire code
//! (`proto::socks`, `proto::http`), shared with the servers.
//!
//! Failures are 3proxy's codes: 30-39 an HTTP CONNECT parent, 40-49 a
//! SOCKS4 parent, 50-59 a SOCKS5 parent, 60+REP a SOCKS5 refusal; a
//! failure to reach the first hop keeps its own code (11-13).
//!
//! Every read and write of a handshake has the CHAIN timeout; the dial of
//! the first hop has the CONNECT timeout.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::net::{Dialer, Family, Stream};
use crate::parent::{extip, pick_avoiding, random, retries, Hop, Kind};
use crate::proto::proxy_v1;
use crate::proto::socks::Dest;
use crate::proto::{http, socks};
use crate::res::Res;
use crate::service::Service;
use crate::timeouts::Timeouts;

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
    /// Straight to the destination (no parent between): the address
    /// connected to, the destination's or, when happy eyeballs took it,
    /// its other family's (`%R`). None through parents: the stream's
    /// peer is the last parent.
    pub peer: Option<SocketAddr>,
}

impl Chain {
    /// Who is at the far end of the stream (`%R`): the address connected
    /// to, or the last parent's, asked of the socket.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer.or_else(|| self.stream.peer_addr())
    }
}

/// Reach `want` through `parents` for a client of `svc`: directly when
/// the list is empty (or a pick takes no hop), else through the chain,
/// with up to `parentretries` attempts. Err: the last attempt's code.
pub fn connect(svc: &Service, parents: &[Hop], want: &Want<'_>) -> Result<Route, Res> {
    if parents.is_empty() {
        let addr = want.addr.ok_or(Res::NOHOST)?;
        let alt = || other_family(want, svc.family, &svc.dialer);
        let (stream, peer) = svc.dialer.connect_either(addr, alt)?;
        return Ok(Route::Stream(Chain {
            stream,
            hops: 0,
            http_parent: false,
            credentials: None,
            peer: Some(peer),
        }));
    }
    match attempts(svc, parents, want, false, Res::PARENT_SOCKS5_REP)? {
        Reached::Route(r) => Ok(r),
        Reached::Udp(_) => Err(Res::PARENT_INTERNAL),
    }
}

/// Up to `parentretries` attempts, each with a fresh pick; Err: the last
/// attempt's code (`none`: the code when no attempt was made). Each
/// attempt tells the parents' health how they did (`health`); a pick
/// leaves out the parents that are down and those that failed in an
/// earlier attempt of this request, while their group has others.
/// Nothing of the client's has gone to the destination before the chain
/// is made, so a retry never repeats a request.
fn attempts(
    svc: &Service,
    parents: &[Hop],
    want: &Want<'_>,
    udp: bool,
    none: Res,
) -> Result<Reached, Res> {
    let ctx = Ctx {
        dialer: &svc.dialer,
        chain_to: svc.timeouts.get(Timeouts::CHAIN),
        tls: svc.tls_client.as_deref(),
        family: svc.family,
    };
    let mut last = none;
    let mut failed: Vec<*const crate::health::Health> = Vec::new();
    for _ in 0..retries() {
        let now = Instant::now();
        let hops = pick_avoiding(parents, &mut random, |h| {
            failed.contains(&std::sync::Arc::as_ptr(&h.health.0)) || h.health.is_down(now)
        });
        // `/metrics`: every parent of the picked chain counts the attempt
        // (and its failure); local redirections and `extip`/`ha` are not
        // parents there.
        let counted: Vec<_> = hops
            .iter()
            .filter(|h| h.counts() && !h.is_local())
            .map(|h| {
                let c = crate::metrics::parent(&format!("{} {}", h.kind.name(), h.addr));
                c.attempts
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                c
            })
            .collect();
        let mut seen = Vec::new();
        let r = attempt(&ctx, &hops, want, &mut random, udp, &mut seen);
        let now = Instant::now();
        for (h, ok) in seen {
            if ok {
                h.health.succeeded();
            } else {
                h.health.failed(&h.policy, now);
                failed.push(std::sync::Arc::as_ptr(&h.health.0));
            }
        }
        match r {
            Ok(r) => return Ok(r),
            // Not a failure another pick would mend the same way, but a
            // pick may take another type: try again like any failure.
            Err(e) => {
                for c in &counted {
                    c.failures
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                last = e
            }
        }
    }
    Err(last)
}

/// What every attempt of a request dials with.
struct Ctx<'a> {
    dialer: &'a Dialer,
    chain_to: Duration,
    tls: Option<&'a crate::tls::Client>,
    family: Family,
}

/// Whom a failed negotiation with a parent says is at fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blame {
    /// The parent did not answer, or not in its protocol.
    Parent,
    /// The parent answered that it cannot reach what it was asked for.
    Unreachable,
    /// The parent answered no for another reason (not allowed, bad
    /// credentials), or we had nothing to ask: it works.
    Nobody,
}

fn blame(e: Res) -> Blame {
    if e == Res::PARENT_CONNECT_REFUSED || e == Res::PARENT_SOCKS4_REFUSED {
        return Blame::Unreachable;
    }
    // REP 3 network unreachable, 4 host unreachable, 5 refused, 6 TTL
    // expired; the other replies say no for other reasons.
    if (3..=6).any(|rep| e == Res::parent_socks5_rep(rep)) {
        return Blame::Unreachable;
    }
    if (0..10).any(|rep| e == Res::parent_socks5_rep(rep)) {
        return Blame::Nobody;
    }
    if e == Res::PARENT_SOCKS5_AUTH_REFUSED
        || e == Res::PARENT_SOCKS5_NO_METHOD
        || e == Res::AUTH_NO_USER
        || e == Res::NOHOST
    {
        return Blame::Nobody;
    }
    Blame::Parent
}

/// The address of the other family of the destination `want` named, when
/// the service takes both (`-46`, `-64`) and the name has one: the second
/// address of happy eyeballs. None for an address literal, with happy
/// eyeballs off, or when the name has no address of the other family.
fn other_family(want: &Want<'_>, family: Family, dialer: &Dialer) -> Option<SocketAddr> {
    if dialer.eyeballs.is_zero() || !matches!(family, Family::V46 | Family::V64) {
        return None;
    }
    let addr = want.addr?;
    let host = want.host.filter(|h| crate::net::parse_ip(h).is_none())?;
    let other = if addr.is_ipv4() {
        Family::V6
    } else {
        Family::V4
    };
    crate::resolve::resolve(host, addr.port(), other)
        .ok()
        .filter(|a| a.is_ipv4() != addr.is_ipv4())
}

/// The addresses of a parent to dial, in the order the service's family
/// puts them (`-6`/`-64` IPv6 first), the second one only when the
/// family takes both; a parent with one family's address only is dialed
/// there whatever the family (it was resolved once, either family).
fn parent_addrs(
    addr: SocketAddr,
    alt: Option<IpAddr>,
    family: Family,
) -> (SocketAddr, Option<SocketAddr>) {
    let Some(alt) = alt.map(|ip| SocketAddr::new(ip, addr.port())) else {
        return (addr, None);
    };
    let (v4, v6) = if addr.is_ipv4() {
        (addr, alt)
    } else {
        (alt, addr)
    };
    match family {
        Family::V4 => (v4, None),
        Family::V6 => (v6, None),
        Family::V46 => (v4, Some(v6)),
        Family::V64 => (v6, Some(v4)),
    }
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
    match attempts(svc, parents, want, true, Res::PARENT_NO_UDP)? {
        Reached::Udp(u) => Ok(u),
        Reached::Route(_) => Err(Res::PARENT_NO_UDP),
    }
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

/// One attempt along the hops of one pick. `seen` gets, for each parent
/// dialed or asked, whether it worked (true) or failed to connect or to
/// negotiate (false), for its health.
fn attempt<'h>(
    ctx: &Ctx<'_>,
    hops: &[&'h Hop],
    want: &Want<'_>,
    rand: &mut impl FnMut() -> u32,
    udp: bool,
    seen: &mut Vec<(&'h Hop, bool)>,
) -> Result<Reached, Res> {
    let mut source: Option<IpAddr> = None;
    let mut ha = false;
    let mut count = 0u32;
    // The stream so far and the hop at its end.
    let mut at: Option<(Stream, &'h Hop)> = None;
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
                    source = Some(extip(h, want.client, rand));
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
            let s = first_hop(ctx, h, want, source, ha, seen)?;
            at = Some((s, h));
        } else if let Some((s, prev)) = &at {
            if matches!(h.kind, Kind::ExtIp | Kind::Ha) {
                // Only meaningful before the first hop (as in 3proxy).
                continue;
            }
            ask_for_next(ctx, s, prev, h, want, seen)?;
            let mut s = at.take().map(|(s, _)| s).ok_or(Res::PARENT_INTERNAL)?;
            if h.tls {
                tls_to(&mut s, h, ctx.tls, ctx.chain_to).inspect_err(|_| seen.push((h, false)))?;
            }
            at = Some((s, h));
        }
        // `tcp` and `http` parents end the chain (and cannot carry UDP).
        if let Some((_, last)) = &at {
            if matches!(last.kind, Kind::Tcp | Kind::Http) {
                break;
            }
        }
    }
    if udp {
        return associate(ctx, at, want, count, source, seen);
    }
    let Some((stream, last)) = at else {
        // No hop picked: straight to the destination.
        return direct(ctx, want, count, source, ha);
    };
    through_last(ctx, stream, last, want, count, seen)
}

/// Dial the first hop `h`, from `source`, with the PROXY header first
/// when `ha` and TLS when its type asks for it.
fn first_hop<'h>(
    ctx: &Ctx<'_>,
    h: &'h Hop,
    want: &Want<'_>,
    source: Option<IpAddr>,
    ha: bool,
    seen: &mut Vec<(&'h Hop, bool)>,
) -> Result<Stream, Res> {
    // The first hop: 0.0.0.0 keeps the requested address, port 0
    // the requested port.
    let mut addr = h.addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(want.addr.ok_or(Res::NOHOST)?.ip());
    }
    if addr.port() == 0 {
        addr.set_port(want.addr.ok_or(Res::NOHOST)?.port());
    }
    let alt = if h.addr.ip().is_unspecified() || source.is_some() {
        None
    } else {
        h.alt
    };
    let (addr, alt) = parent_addrs(addr, alt, ctx.family);
    let (mut s, _) = dial(ctx.dialer, source, addr, || alt).inspect_err(|e| {
        if *e == Res::CONNECT {
            seen.push((h, false));
        }
    })?;
    if ha {
        send_proxy_header(&s, ctx.chain_to, want).inspect_err(|_| seen.push((h, false)))?;
    }
    if h.tls {
        tls_to(&mut s, h, ctx.tls, ctx.chain_to).inspect_err(|_| seen.push((h, false)))?;
    }
    Ok(s)
}

/// Ask `prev`, the hop at the end of `s`, to connect to the next hop `h`;
/// `seen` gets which of them failed, if one did.
fn ask_for_next<'h>(
    ctx: &Ctx<'_>,
    s: &Stream,
    prev: &'h Hop,
    h: &'h Hop,
    want: &Want<'_>,
    seen: &mut Vec<(&'h Hop, bool)>,
) -> Result<(), Res> {
    let next = if prev.kind.sends_name() {
        Dest::Name(h.host.clone(), h.addr.port())
    } else {
        Dest::Addr(h.addr)
    };
    negotiate(prev, s, ctx.chain_to, &next, want).inspect_err(|e| match blame(*e) {
        Blame::Parent => seen.push((prev, false)),
        // The parent before could not reach this one.
        Blame::Unreachable => {
            seen.push((prev, true));
            seen.push((h, false));
        }
        Blame::Nobody => seen.push((prev, true)),
    })?;
    seen.push((prev, true));
    Ok(())
}

/// UDP mode's end of an attempt: a UDP ASSOCIATE with the last hop of
/// `at`, which must be a `socks5` or `socks5+` parent; no hop at all
/// relays directly.
fn associate<'h>(
    ctx: &Ctx<'_>,
    at: Option<(Stream, &'h Hop)>,
    want: &Want<'_>,
    count: u32,
    source: Option<IpAddr>,
    seen: &mut Vec<(&'h Hop, bool)>,
) -> Result<Reached, Res> {
    let Some((control, last)) = at else {
        // No hop (an `extip` alone does not apply to UDP).
        return Ok(Reached::Udp(None));
    };
    if !matches!(last.kind, Kind::Socks5 | Kind::Socks5Plus) {
        return Err(Res::PARENT_NO_UDP);
    }
    let creds = credentials(last, want)?;
    let _ = control.set_timeout(Some(ctx.chain_to));
    let mut relay = socks::client_v5_udp(&control, creds.as_ref())
        .inspect_err(|e| seen.push((last, blame(*e) != Blame::Parent)))?;
    seen.push((last, true));
    if relay.ip().is_unspecified() {
        // "Same address as the control connection" (RFC 1928 leaves
        // it open; most servers mean their own address).
        relay.set_ip(last.addr.ip());
    }
    let _ = control.set_timeout(None);
    Ok(Reached::Udp(Some(UdpChain {
        control,
        relay,
        hops: count,
        source,
    })))
}

/// No hop picked: dial the destination itself, from `source`, with the
/// PROXY header first when `ha`.
fn direct(
    ctx: &Ctx<'_>,
    want: &Want<'_>,
    count: u32,
    source: Option<IpAddr>,
    ha: bool,
) -> Result<Reached, Res> {
    let addr = want.addr.ok_or(Res::NOHOST)?;
    let alt = || {
        if source.is_some() {
            None
        } else {
            other_family(want, ctx.family, ctx.dialer)
        }
    };
    let (s, peer) = dial(ctx.dialer, source, addr, alt)?;
    if ha {
        send_proxy_header(&s, ctx.chain_to, want)?;
    }
    Ok(Reached::Route(Route::Stream(Chain {
        stream: s,
        hops: count,
        http_parent: false,
        credentials: None,
        peer: Some(peer),
    })))
}

/// The end of a chain: ask its last hop for the destination (a `tcp` or
/// `http` parent is not asked; its credentials go with the chain).
fn through_last<'h>(
    ctx: &Ctx<'_>,
    stream: Stream,
    last: &'h Hop,
    want: &Want<'_>,
    count: u32,
    seen: &mut Vec<(&'h Hop, bool)>,
) -> Result<Reached, Res> {
    let mut credentials_out = None;
    if matches!(last.kind, Kind::Tcp | Kind::Http) {
        credentials_out = credentials(last, want)?;
    } else {
        let dest = want.dest(last.kind.sends_name())?;
        // A refusal to reach the destination is no fault of the parent.
        negotiate(last, &stream, ctx.chain_to, &dest, want)
            .inspect_err(|e| seen.push((last, blame(*e) != Blame::Parent)))?;
    }
    // The last hop connected (and negotiated, if it does): it works.
    seen.push((last, true));
    Ok(Reached::Route(Route::Stream(Chain {
        stream,
        hops: count,
        http_parent: last.kind == Kind::Http,
        credentials: credentials_out,
        peer: None,
    })))
}

/// Dial `addr`, from `source` if an `extip` set one, racing the address
/// `alt` gives (the other family's) after the happy eyeballs delay; the
/// stream and the address it reached.
fn dial(
    dialer: &Dialer,
    source: Option<IpAddr>,
    addr: SocketAddr,
    alt: impl FnOnce() -> Option<SocketAddr>,
) -> Result<(Stream, SocketAddr), Res> {
    let open = |d: &Dialer| d.connect_either(addr, alt);
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

/// A parent whose type ends in `s`: TLS on `s` before its protocol,
/// within the CHAIN timeout. Not inside another hop's TLS.
fn tls_to(
    s: &mut Stream,
    h: &Hop,
    tls: Option<&crate::tls::Client>,
    chain_to: Duration,
) -> Result<(), Res> {
    let t = tls.ok_or(Res::PARENT_INTERNAL)?;
    if s.is_tls() {
        return Err(Res::TLS_PARENT);
    }
    let name = t.server_name(&h.host).ok_or(Res::TLS_PARENT)?;
    let deadline = std::time::Instant::now() + chain_to;
    s.connect_tls(t.config.clone(), name, deadline)
        .map_err(|e| {
            log::debug!("parent {}:{}: {e}", h.host, h.addr.port());
            Res::TLS_PARENT
        })
}

/// `ha`: the PROXY protocol v1 line for the client's connection.
fn send_proxy_header(s: &Stream, chain_to: Duration, want: &Want<'_>) -> Result<(), Res> {
    let (Some(cli), Some(srv)) = (want.client, want.local) else {
        return Err(Res::PARENT_HA_SEND);
    };
    let line = proxy_v1::encode(cli, srv);
    let _ = s.set_timeout(Some(chain_to));
    let mut w = s;
    w.write_all(line.as_bytes())
        .map_err(|_| Res::PARENT_HA_SEND)
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
        Kind::Connect | Kind::ConnectPlus => http::client_connect(s, dest, creds.as_ref()),
        Kind::Socks4 | Kind::Socks4Plus | Kind::Socks4b => {
            socks::client_v4_connect(s, dest, creds.as_ref(), h.kind == Kind::Socks4b)
        }
        Kind::Socks5 | Kind::Socks5Plus | Kind::Socks5b => {
            socks::client_v5_connect(s, dest, creds.as_ref(), h.kind == Kind::Socks5b)
        }
        // tcp and http relay as they are; the rest never get here.
        _ => Ok(()),
    }
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
        let r = dial(&plain, Some(src), to, || None);
        assert_ne!(r.map(|_| ()).unwrap_err(), Res::BIND);
    }

    #[test]
    fn the_family_orders_a_parents_addresses() {
        let v4: SocketAddr = "192.0.2.1:1080".parse().unwrap();
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let v6a = SocketAddr::new(v6, 1080);
        assert_eq!(parent_addrs(v4, Some(v6), Family::V46), (v4, Some(v6a)));
        assert_eq!(parent_addrs(v4, Some(v6), Family::V64), (v6a, Some(v4)));
        assert_eq!(parent_addrs(v4, Some(v6), Family::V4), (v4, None));
        assert_eq!(parent_addrs(v4, Some(v6), Family::V6), (v6a, None));
        // One family only: there, whatever the service's family.
        assert_eq!(parent_addrs(v4, None, Family::V6), (v4, None));
        assert_eq!(parent_addrs(v6a, None, Family::V4), (v6a, None));
    }

    #[test]
    fn whom_a_failed_negotiation_blames() {
        assert_eq!(blame(Res::PARENT_SOCKS5_NO_GREETING), Blame::Parent);
        assert_eq!(blame(Res::PARENT_SOCKS5_NO_REPLY), Blame::Parent);
        assert_eq!(blame(Res::PARENT_CONNECT_REPLY), Blame::Parent);
        assert_eq!(blame(Res::PARENT_SOCKS4_SHORT), Blame::Parent);
        assert_eq!(blame(Res::parent_socks5_rep(5)), Blame::Unreachable);
        assert_eq!(blame(Res::parent_socks5_rep(4)), Blame::Unreachable);
        assert_eq!(blame(Res::parent_socks5_rep(2)), Blame::Nobody);
        assert_eq!(blame(Res::PARENT_CONNECT_REFUSED), Blame::Unreachable);
        assert_eq!(blame(Res::PARENT_SOCKS5_AUTH_REFUSED), Blame::Nobody);
        assert_eq!(blame(Res::AUTH_NO_USER), Blame::Nobody);
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
