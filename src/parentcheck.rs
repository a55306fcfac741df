//! `parentcheck` (threeproxy's own; 3proxy.cfg(5) "parentcheck"): active
//! checks of the parents that follow the command, by one checker thread
//! for the whole process. A check is a TCP connect, or for a `socks5`
//! parent its greeting, or for a `connect` parent (with a target) an HTTP
//! CONNECT to that target. Its outcome goes to the parent's health
//! (`health`) like a request's: failures in a row mark it down, a success
//! marks it up at once.
//!
//! The list of parents to check is the running cfg's: [`install`] (at
//! load and at every reload) replaces it. Checks run one after the other
//! on the one thread, each within its own timeout, from the outgoing side
//! of the services that use the parent ([`for_services`]).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::net::Dialer;
use crate::parent::{Hop, Kind};
use crate::proto::socks::Dest;
use crate::proto::{http, socks};

/// `parentcheck INTERVAL [TIMEOUT [HOST:PORT]]` as it stood at a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub interval: Duration,
    pub timeout: Duration,
    /// Where a `connect` parent is asked to CONNECT to (the name is sent
    /// as written); None: a TCP connect only.
    pub target: Option<(String, u16)>,
}

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// One parent to check, from one outgoing side.
#[derive(Debug, Clone)]
pub struct Probe {
    pub hop: Hop,
    pub check: Check,
    /// Where the check leaves from: the outgoing side (`-e`, `-De`,
    /// `-ne`, `-os`) of a service whose ACL names the parent, as that
    /// service's sessions reach it ([`for_services`]); the default
    /// source for a parent no service names. Its timeout and happy
    /// eyeballs are the check's own.
    pub from: Dialer,
}

/// The probes of `probes` for the services whose ACLs and outgoing sides
/// `services` gives: each parent once from every distinct outgoing side
/// (source addresses, device, namespace) of the services that name it,
/// or once from the default source if none does.
pub fn for_services<'a>(
    probes: Vec<Probe>,
    services: impl Iterator<Item = (&'a [crate::acl::Entry], &'a Dialer)> + Clone,
) -> Vec<Probe> {
    let same = |a: &Dialer, b: &Dialer| {
        (&a.ext4, &a.ext6, &a.device, &a.netns) == (&b.ext4, &b.ext6, &b.device, &b.netns)
    };
    let mut out = Vec::with_capacity(probes.len());
    for p in probes {
        let names = |acl: &[crate::acl::Entry]| {
            acl.iter().any(|e| {
                e.parents
                    .iter()
                    .any(|h| std::sync::Arc::ptr_eq(&h.health.0, &p.hop.health.0))
            })
        };
        let mut froms: Vec<Dialer> = Vec::new();
        for (_, d) in services.clone().filter(|(acl, _)| names(acl)) {
            if !froms.iter().any(|f| same(f, d)) {
                froms.push(d.clone());
            }
        }
        if froms.is_empty() {
            froms.push(Dialer::default());
        }
        for from in froms {
            out.push(Probe { from, ..p.clone() });
        }
    }
    out
}

struct List {
    /// The probes and when each is due.
    probes: Vec<(Probe, Instant)>,
    started: bool,
}

static LIST: Mutex<List> = Mutex::new(List {
    probes: Vec::new(),
    started: false,
});
static CHANGED: Condvar = Condvar::new();

/// Check `probes` from now on (the running cfg's), instead of the ones
/// before; the first checks are due at once. Starts the checker thread
/// the first time there is something to check.
pub fn install(probes: Vec<Probe>) {
    let mut l = LIST.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    l.probes = probes.into_iter().map(|p| (p, now)).collect();
    if !l.probes.is_empty() && !l.started {
        let spawned = std::thread::Builder::new()
            .name("parentcheck".into())
            .stack_size(256 << 10)
            .spawn(run);
        match spawned {
            Ok(_) => l.started = true,
            Err(e) => log::error!("parentcheck: cannot start the checker thread: {e}"),
        }
    }
    CHANGED.notify_all();
}

fn run() {
    loop {
        let probe = {
            let mut l = LIST.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                let now = Instant::now();
                let due = l
                    .probes
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(i, (_, at))| (i, *at));
                match due {
                    Some((i, at)) if at <= now => {
                        let (p, next) = &mut l.probes[i];
                        *next = now + p.check.interval;
                        break p.clone();
                    }
                    Some((_, at)) => {
                        l = CHANGED
                            .wait_timeout(l, at - now)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                    None => {
                        l = CHANGED
                            .wait_timeout(l, Duration::from_secs(3600))
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
            }
        };
        let ok = check(&probe);
        let h = &probe.hop;
        if ok {
            h.health.succeeded();
        } else {
            h.health.failed(&h.policy, Instant::now());
        }
    }
}

/// Check one parent: true when it answered as its type should.
pub fn check(p: &Probe) -> bool {
    let h = &p.hop;
    let dialer = Dialer {
        timeout: p.check.timeout,
        eyeballs: crate::net::DEFAULT_EYEBALLS,
        ..p.from.clone()
    };
    let alt = h.alt.map(|ip| SocketAddr::new(ip, h.addr.port()));
    let (first, second) = match alt {
        Some(a) if h.addr.is_ipv6() => (a, Some(h.addr)),
        a => (h.addr, a),
    };
    let Ok((s, _)) = dialer.connect_either(first, || second) else {
        log::debug!("parentcheck: {}: connect failed", h.name());
        return false;
    };
    if h.tls {
        // Its protocol runs inside TLS: the connect is the check.
        return true;
    }
    let _ = s.set_timeout(Some(p.check.timeout));
    let creds = match h.user.as_deref() {
        None | Some("*") => None,
        Some(u) => Some((u.to_string(), h.password.clone().unwrap_or_default())),
    };
    let ok = match h.kind {
        Kind::Socks5 | Kind::Socks5Plus | Kind::Socks5b => {
            let mut w = &s;
            let mut r = [0u8; 2];
            w.write_all(&socks::v5_greeting(creds.is_some())).is_ok()
                && (&s).read_exact(&mut r).is_ok()
                && r[0] == 5
                && r[1] != 0xff
        }
        Kind::Connect | Kind::ConnectPlus => match &p.check.target {
            Some((host, port)) => {
                let dest = match crate::net::parse_ip(host) {
                    Some(ip) => Dest::Addr(SocketAddr::new(ip, *port)),
                    None => Dest::Name(host.clone(), *port),
                };
                http::client_connect(&s, &dest, creds.as_ref()).is_ok()
            }
            None => true,
        },
        _ => true,
    };
    if !ok {
        log::debug!("parentcheck: {}: no answer in its protocol", h.name());
    }
    ok
}
