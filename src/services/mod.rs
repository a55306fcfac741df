//! The service table (3proxy's `proxydef` and `childdef`): every service's
//! code, found by its cfg name; building a service from its cfg line
//! ([`prepare`]) and starting its acceptor ([`start`]).
//!
//! What a service *is* (its settings, options, the bound socket) is in
//! `crate::service`, below the core; this module is above it, since the
//! table holds each service's code.

pub mod admin;
pub mod auto;
pub mod dnspr;
pub mod ftppr;
pub mod imapp;
pub mod login;
pub mod pop3p;
pub mod proxy;
pub mod smtpp;
pub mod socks;
pub mod tcppm;
pub mod tlspr;
pub mod udppm;

use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Condvar, Mutex};

use crate::client::Client;
use crate::conf::state::State;
use crate::conf::token::quote;
use crate::conf::value::number;
use crate::log::Sink;
use crate::logformat::LogFormat;
use crate::net::{Addr, Dialer, Listener, Target};
use crate::parent::{Known, Next, MAX_HANDOFFS, REDIRECTION_LOOP};
use crate::res::Res;
use crate::running::{self, Bound, Prepared, Running};
use crate::service::{
    LogOpt, Service, ServiceDef, ServiceOpts, BASE_STACK, DEFAULT_BUFSIZE, MIN_STACK,
};
use crate::sys::sockopt::SockOpts;
use crate::timeouts::Timeouts;

/// A TCP service's handler: serve a client (of which `early` was read
/// already, and whose destination may be known, when it comes through a
/// local redirection) and say what comes next.
pub type Handler = fn(&mut Client, &[u8], Option<&Known>) -> Next;

/// How a service serves a client once accepted.
pub enum Kind {
    /// TCP: the handler a client thread runs.
    Tcp(Handler),
    /// UDP: the function that runs the service's socket loop.
    Udp(fn(Arc<Running>, UdpSocket)),
}

/// One entry of the service table: what it is, and its code (3proxy's
/// `proxydef` and `childdef`).
pub struct Entry {
    pub def: ServiceDef,
    pub kind: Kind,
}

/// The services, with 3proxy's names: every service of 3proxy 1.0.0.
pub static SERVICES: &[Entry] = &[
    Entry {
        def: ServiceDef {
            name: "tcppm",
            log_name: "TCPPM",
            default_port: 0,
            positional: 3,
            udp: false,
        },
        kind: Kind::Tcp(tcppm::serve),
    },
    Entry {
        def: ServiceDef {
            name: "udppm",
            log_name: "UDPPM",
            default_port: 0,
            positional: 3,
            udp: true,
        },
        kind: Kind::Udp(udppm::run),
    },
    Entry {
        def: ServiceDef {
            name: "socks",
            log_name: "SOCKS",
            default_port: 1080,
            positional: 0,
            udp: false,
        },
        kind: Kind::Tcp(socks::serve),
    },
    Entry {
        def: ServiceDef {
            name: "proxy",
            log_name: "PROXY",
            default_port: 3128,
            positional: 0,
            udp: false,
        },
        kind: Kind::Tcp(proxy::serve),
    },
    Entry {
        def: ServiceDef {
            name: "dnspr",
            log_name: "DNSPR",
            default_port: 53,
            positional: 0,
            udp: true,
        },
        kind: Kind::Udp(dnspr::run),
    },
    Entry {
        def: ServiceDef {
            name: "auto",
            log_name: "AUTO",
            default_port: 8080,
            positional: 0,
            udp: false,
        },
        kind: Kind::Tcp(auto::serve),
    },
    Entry {
        def: ServiceDef {
            name: "tlspr",
            log_name: "TLSPR",
            default_port: 1443,
            positional: 0,
            udp: false,
        },
        kind: Kind::Tcp(tlspr::serve),
    },
    Entry {
        def: ServiceDef {
            name: "pop3p",
            log_name: "POP3P",
            default_port: 110,
            positional: 0,
            udp: false,
        },
        kind: Kind::Tcp(pop3p::serve),
    },
    Entry {
        def: ServiceDef {
            name: "ftppr",
            log_name: "FTPPR",
            default_port: 21,
            positional: 0,
            udp: false,
        },
        kind: Kind::Tcp(ftppr::serve),
    },
    Entry {
        def: ServiceDef {
            name: "imapp",
            log_name: "IMAPP",
            default_port: 143,
            positional: 0,
            udp: false,
        },
        kind: Kind::Tcp(imapp::serve),
    },
    Entry {
        def: ServiceDef {
            name: "admin",
            log_name: "ADMIN",
            default_port: 80,
            positional: 0,
            udp: false,
        },
        kind: Kind::Tcp(admin::serve),
    },
    Entry {
        def: ServiceDef {
            name: "smtpp",
            log_name: "SMTPP",
            default_port: 587,
            positional: 0,
            udp: false,
        },
        kind: Kind::Tcp(smtpp::serve),
    },
];

/// The table entry of a service's settings.
pub fn entry_of(def: &ServiceDef) -> &'static Entry {
    SERVICES
        .iter()
        .find(|e| std::ptr::eq(&e.def, def))
        .expect("a service's def is an entry of the table")
}

/// What a client thread runs for a client of a TCP service (3proxy's
/// `threadfunc` and `childfunc`): the PROXY protocol header (`-H`), read
/// once here for every service, then the service's handler, then the
/// handler each local redirection hands the client to, in one bounded
/// loop (3proxy's MAXCHILDREDIRECTS). The client's record is written when
/// it drops, after the loop.
fn child(c: &mut Client, resume: Option<(Box<dyn crate::client::Tail>, crate::client::Resumed)>) {
    let mut next = match resume {
        // Back from the parking lot: the handler's rest, then on as if
        // the handler had returned.
        Some((tail, how)) => tail.resume(c, how),
        None => {
            if c.svc().opts.proxy_header && !crate::session::read_proxy_header(c) {
                return;
            }
            if !crate::session::hold_connlim(c) {
                return;
            }
            if c.svc().tls_server.is_some() && !crate::session::accept_tls(c) {
                return;
            }
            let Kind::Tcp(serve) = entry_of(c.svc().def).kind else {
                return;
            };
            if c.svc().def.name == "tcppm" {
                // No head to wait for: busy from here.
                c.live.busy();
            }
            serve(c, &[], None)
        }
    };
    let mut taken = 0;
    while let Next::Handoff(h) = next {
        taken += 1;
        // A hand-off without a hop (a mail proxy's STARTTLS client going
        // to tlspr) is not a redirection through the ACL.
        if h.hops > 0 {
            c.redirected = true;
        }
        c.local_hops += h.hops;
        // What the first handler learned is not the next one's record;
        // `%N` stays (3proxy keeps the service, SOCK5 after a SOCKS5
        // handshake).
        c.record.text.clear();
        c.req_host = None;
        c.req_addr = None;
        c.remote_addr = None;
        c.ext_addr = None;
        c.ext_from_srv = false;
        c.cli_read_timeout = None;
        c.record.res = Res::OK;
        c.record.open();
        c.hops = c.local_hops;
        if taken > MAX_HANDOFFS {
            c.record.res = REDIRECTION_LOOP;
            c.record.text = "local redirection loop".into();
            return;
        }
        let handler = h
            .kind
            .handler()
            .and_then(|name| SERVICES.iter().find(|e| e.def.name == name))
            .map(|e| &e.kind);
        let Some(&Kind::Tcp(serve)) = handler else {
            // Refused by `Client::hand_over`; never scheduled.
            c.record.res = Res::NOTIMPL;
            return;
        };
        next = serve(c, &h.early, h.dest.as_ref());
    }
}

/// A port mapper's LPORT or DSTPORT, positional argument `i`. 3proxy
/// reads it with atoi and refuses 0: a word that starts with a port
/// (`8080/tcp`) is read as that port, with a warning.
fn mapper_port(opts: &mut ServiceOpts, i: usize, what: &str) -> Result<u16, String> {
    let word = opts.positional[i].clone();
    let (port, why) = crate::conf::value::atoi_number(&word, 0u16, 65535)?;
    if let Some(why) = why {
        if port == 0 {
            return Err(number(&word, 1u16, 65535).unwrap_err());
        }
        opts.warnings.push(format!("{what}: {why}"));
    }
    Ok(port)
}

/// Build a service from its cfg line and the state so far, and bind it.
pub fn prepare(state: &State, args: &[String]) -> Result<Prepared, String> {
    let (def, mut opts) = options(state, args)?;
    let tls = tls(state, def, &mut opts)?;
    let (listen, target) = listen_addr(state, def, &mut opts)?;
    let udp = def.udp;
    let (log, logformat) = log_of(state, &opts)?;
    let mut stack = BASE_STACK + state.stacksize + opts.stack_add.unwrap_or(0);
    if tls.server.is_some() || tls.client.is_some() || tls.mitm.is_some() {
        stack += crate::service::TLS_STACK;
    }
    let dialer = dialer(state, &opts);
    let backlog = if state.backlog > 0 {
        state.backlog
    } else {
        1 + state.maxconn / 8
    };
    let key = socket_key(def, &listen, &opts, backlog)?;
    let back_listener = match opts.back_listen {
        Some(_) if def.name != "tcppm" => {
            return Err("-R (connect-back listener) is for tcppm".into());
        }
        Some(_) if state.check_only => None,
        Some(a) => Some(back_listener(a, &opts.cb_listen, state.maxconn)?),
        None => None,
    };
    let reuse = if state.check_only {
        None
    } else {
        crate::running::all()
            .into_iter()
            .find(|r| r.key == key && !state.claimed.contains(&key))
    };
    if state.check_only || reuse.is_some() {
        // `-t` must not disturb a running server: no bind, no listen, no
        // unlinking of a unix socket file; ports in use are found at start.
        // A reload keeps the running socket and its real address.
        let listen = match &reuse {
            Some(r) => r.current().listen.clone(),
            None => listen,
        };
        let mut svc = build(
            def, opts, state, listen, target, dialer, log, logformat, stack,
        );
        complete(&mut svc, &key, back_listener, tls);
        return Ok(Prepared {
            svc: Arc::new(svc),
            socket: None,
            reuse,
            key,
        });
    }
    let socket = bind(&opts, &listen, udp, backlog)?;
    // Port 0 asks the kernel for one: report the real one in the log.
    let listen = match (&socket, &listen) {
        (Bound::Stream(l), Addr::Ip(_)) => l.local_addr().map(Addr::Ip).unwrap_or(listen),
        (Bound::Datagram(u), _) => u.local_addr().map(Addr::Ip).unwrap_or(listen),
        _ => listen,
    };

    let mut svc = build(
        def, opts, state, listen, target, dialer, log, logformat, stack,
    );
    complete(&mut svc, &key, back_listener, tls);
    Ok(Prepared {
        svc: Arc::new(svc),
        socket: Some(socket),
        reuse: None,
        key,
    })
}

/// The service's table entry and its options from its cfg line: checked
/// for the service's own options and for its count of positional
/// arguments.
fn options(state: &State, args: &[String]) -> Result<(&'static ServiceDef, ServiceOpts), String> {
    let name = args[0].as_str();
    let Some(def) = SERVICES.iter().find(|e| e.def.name == name).map(|e| &e.def) else {
        let _ = name;
        return Err("this service is not supported yet by this version of 3proxy".to_string());
    };
    let opts = ServiceOpts::parse(&args[1..], state.maxseg)?;
    if def.name == "dnspr" {
        dnspr::fake(&opts)?;
    }
    if matches!(def.name, "tlspr" | "auto") {
        tlspr::options(&opts)?;
    }
    if opts.positional.len() != def.positional {
        return Err(if def.positional == 3 {
            format!(
                "takes [options] LPORT DSTHOST DSTPORT, got {} positional arguments",
                opts.positional.len()
            )
        } else {
            format!(
                "unexpected argument '{}'",
                quote(&opts.positional[def.positional.min(opts.positional.len() - 1)])
            )
        });
    }
    Ok((def, opts))
}

/// A service's TLS settings, which [`build`] leaves out.
struct Tls {
    server: Option<Arc<rustls::ServerConfig>>,
    client: Option<Arc<crate::tls::Client>>,
    mitm: Option<Arc<crate::tls::mitm::Mitm>>,
}

/// The service's TLS: its server and client sides (none for a UDP
/// service) and `ssl_mitm`, with a warning in `opts` when the origins'
/// certificates go unchecked.
fn tls(state: &State, def: &ServiceDef, opts: &mut ServiceOpts) -> Result<Tls, String> {
    let (server, client) = if def.udp {
        (None, None)
    } else {
        let tls_hops = state
            .access
            .acl
            .iter()
            .any(|e| e.parents.iter().any(|h| h.tls));
        (
            state.tls.server_config()?,
            state.tls.client(tls_hops, def.name)?,
        )
    };
    // `ssl_mitm`: the services whose clients ask for a tunnel to a named
    // destination (3proxy's CONNECT operations that carry TLS), and
    // tlspr, whose clients name it in their SNI.
    let mitm = if matches!(def.name, "proxy" | "socks" | "tcppm" | "tlspr") {
        state.tls.mitm()?
    } else {
        None
    };
    if mitm.is_some() && !state.tls.client.verify {
        opts.warnings.push(
            "ssl_mitm without ssl_client_verify: the origins' certificates are not checked, \
             so a client trusts whoever answers for the origin (insecure, as 3proxy.cfg(5) says)"
                .into(),
        );
    }
    Ok(Tls {
        server,
        client,
        mitm,
    })
}

/// Where the service listens (`-p`, `-i` or `internal`; a port mapper's
/// LPORT), and a port mapper's DSTHOST and DSTPORT.
fn listen_addr(
    state: &State,
    def: &ServiceDef,
    opts: &mut ServiceOpts,
) -> Result<(Addr, Option<Target>), String> {
    let mut port = opts.port.unwrap_or(def.default_port);
    let mut target = None;
    if def.positional == 3 {
        // A port mapper's LPORT wins over -p, as in 3proxy.
        port = mapper_port(opts, 0, "LPORT")?;
        let rport = mapper_port(opts, 2, "DSTPORT")?;
        target = Some(Target::parse(&opts.positional[1], rport)?);
    }
    let internal = opts
        .internal
        .as_deref()
        .or(state.internal.as_deref())
        .unwrap_or("0.0.0.0");
    let listen = Addr::parse_listen(internal, port)?;
    if def.udp && !matches!(listen, Addr::Ip(_)) {
        return Err("a UDP service cannot listen on a unix socket".into());
    }
    Ok((listen, target))
}

/// The service's log (`-l`, or the cfg's) and its format.
fn log_of(
    state: &State,
    opts: &ServiceOpts,
) -> Result<(Option<Arc<Sink>>, Arc<LogFormat>), String> {
    let log = match &opts.log {
        None => state.log.clone(),
        Some(LogOpt::Stdout) => Some(Sink::stdout()),
        // `-t` creates no file: the log is only checked.
        Some(LogOpt::File(p)) if state.check_only => {
            Sink::check_file(p, crate::log::Period::Never)
                .map_err(|e| format!("-l{}: {e}", quote(p)))?;
            None
        }
        Some(LogOpt::File(p)) => {
            Some(Sink::open(p, state.ops.owner()).map_err(|e| format!("-l{}: {e}", quote(p)))?)
        }
        Some(LogOpt::Syslog(ident)) => Some(Sink::syslog(ident)),
    };
    let logformat = match &opts.logformat {
        Some(f) => Arc::new(LogFormat::parse(f)),
        None => state.logformat.clone(),
    };
    Ok((log, logformat))
}

/// How the service's connections out are made (`-e`, `external`, the
/// CONNECT timeout, happy eyeballs).
fn dialer(state: &State, opts: &ServiceOpts) -> Dialer {
    Dialer {
        ext4: opts.ext4.or(state.ext4),
        ext6: opts.ext6.or(state.ext6),
        device: opts.dev_out.clone(),
        netns: opts.ns_out.clone(),
        opts: opts.os.clone(),
        timeout: state.timeouts.get(Timeouts::CONNECT),
        freebind: false,
        eyeballs: state.eyeballs,
    }
}

/// The key of the service's socket; Err for connect-back on a UDP
/// service.
fn socket_key(
    def: &ServiceDef,
    listen: &Addr,
    opts: &ServiceOpts,
    backlog: u32,
) -> Result<String, String> {
    // What makes a listening socket the same one across a reload: the
    // service, the address as written, and every option that shaped it.
    let mut key = format!(
        "{}|{}|{:?}|{:?}|{:?}|{backlog}",
        def.name, listen, opts.ol, opts.dev_in, opts.ns_in
    );
    // Connect-back (`-r`, `-R`): see `crate::connectback`.
    if let Some(to) = opts.connect_to {
        if def.udp {
            return Err("-r (connect-back) is for TCP services".into());
        }
        // Nothing listens: the "socket" is the dialing loop.
        key = format!("{}|{}|r={to}|{:?}", def.name, listen, opts.cb_client);
    }
    Ok(key)
}

/// Bind the service's socket: connect-back's dialing loop (`-r`), a UDP
/// socket, or a listener.
fn bind(opts: &ServiceOpts, listen: &Addr, udp: bool, backlog: u32) -> Result<Bound, String> {
    Ok(if opts.connect_to.is_some() {
        Bound::Dial(crate::connectback::Wake::new().map_err(|e| format!("-r: {e}"))?)
    } else if udp {
        let &Addr::Ip(a) = listen else { unreachable!() };
        let u = crate::net::in_netns(opts.ns_in.as_deref(), || {
            bind_udp(a, opts.dev_in.as_deref())
        });
        Bound::Datagram(u.map_err(|e| format!("cannot bind UDP {a}: {e}"))?)
    } else {
        let l = crate::net::in_netns(opts.ns_in.as_deref(), || {
            Listener::bind(listen, backlog as i32, &opts.ol, opts.dev_in.as_deref())
        })
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        Bound::Stream(l)
    })
}

/// Set on a service what [`build`] leaves out: its socket's key, its
/// `-R` listener and its TLS.
fn complete(
    svc: &mut Service,
    key: &str,
    back_listener: Option<Arc<crate::connectback::BackListener>>,
    tls: Tls,
) {
    key.clone_into(&mut svc.key);
    svc.back_listener = back_listener;
    svc.tls_server = tls.server;
    svc.tls_client = tls.client;
    svc.mitm = tls.mitm;
}

/// The `-R` listener on `addr`: the one a running service already has
/// (a reload keeps it, with any back-connection queued on it), or a new
/// one.
fn back_listener(
    addr: SocketAddr,
    opts: &SockOpts,
    maxconn: u32,
) -> Result<Arc<crate::connectback::BackListener>, String> {
    let k = crate::connectback::key(addr, opts);
    let running = crate::running::all()
        .into_iter()
        .find_map(|r| r.current().back_listener.clone().filter(|b| b.key == k));
    if let Some(b) = running {
        return Ok(b);
    }
    let backlog = 1 + (maxconn >> 4) as i32;
    crate::connectback::BackListener::bind(addr, opts, backlog)
        .map(Arc::new)
        .map_err(|e| format!("-R: cannot listen on {addr}: {e}"))
}

#[allow(clippy::too_many_arguments)]
fn build(
    def: &'static ServiceDef,
    opts: ServiceOpts,
    state: &State,
    listen: Addr,
    target: Option<Target>,
    dialer: Dialer,
    log: Option<Arc<Sink>>,
    logformat: Arc<LogFormat>,
    stack: i64,
) -> Service {
    Service {
        metrics: crate::metrics::service(def.name, listen.port()),
        def,
        key: String::new(),
        logdump: (0, 0),
        delimchar: b'@',
        family: opts.family.unwrap_or_default(),
        bufsize: opts.bufsize.unwrap_or(DEFAULT_BUFSIZE),
        opts,
        timeouts: state.timeouts,
        maxconn: state.maxconn,
        reclaim: state.reclaim,
        guard: crate::live::Guard {
            key: 0,
            // A port mapper reads no head, but its PROXY header or TLS
            // handshake is one (its handler says when it is busy).
            head: !def.udp,
            rate: state.minrate.0,
            grace_ms: state.minrate.1.saturating_mul(1000),
        },
        listen,
        target,
        dialer,
        log,
        logformat,
        stack_size: stack.max(MIN_STACK) as usize,
        park_linger: std::time::Duration::from_millis(u64::from(state.parklinger)),
        live: Mutex::new(0),
        left: Condvar::new(),
        slot_waiters: std::sync::atomic::AtomicU32::new(0),
        access: state.access.snapshot(),
        transparent: state.transparent == Some(true),
        traffic: None,
        back_listener: None,
        filters: (!state.filters.is_empty()).then(|| Arc::new(state.filters.clone())),
        filtermaxsize: state.filtermaxsize,
        strings: state.strings.clone(),
        tls_server: None,
        tls_client: None,
        mitm: None,
    }
}

fn bind_udp(a: SocketAddr, device: Option<&str>) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = if a.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let sock = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
    sock.set_reuse_address(true)?;
    // IPV6_V6ONLY as the system has it, as for TCP (`net::tcp_listener`).
    if let Some(dev) = device {
        sock.bind_device(Some(dev.as_bytes()))?;
    }
    sock.bind(&a.into())?;
    Ok(sock.into())
}

/// Start serving: the acceptor (or UDP loop) thread of the service, or,
/// for a socket kept across a reload, the new settings for its next clients.
pub fn start(p: Prepared) -> std::io::Result<()> {
    let Prepared {
        svc,
        socket,
        reuse,
        key,
    } = p;
    if let Some(r) = reuse {
        r.swap(svc);
        return Ok(());
    }
    let Some(socket) = socket else { return Ok(()) };
    let name = format!("{}:{}", svc.def.name, svc.port());
    let kind = &entry_of(svc.def).kind;
    match socket {
        Bound::Stream(l) => {
            let r = Arc::new(Running::new(key, svc, &l));
            running::register(r.clone());
            std::thread::Builder::new()
                .name(name)
                .spawn(move || crate::acceptor::run(r, l, child))?;
        }
        Bound::Dial(w) => {
            let r = Arc::new(Running::new(key, svc, &w.a));
            running::register(r.clone());
            std::thread::Builder::new()
                .name(name)
                .spawn(move || crate::acceptor::run_dialing(r, w, child))?;
        }
        Bound::Datagram(u) => {
            let &Kind::Udp(serve) = kind else {
                return Err(std::io::Error::other("a datagram socket for a TCP service"));
            };
            let r = Arc::new(Running::new(key, svc, &u));
            running::register(r.clone());
            std::thread::Builder::new()
                .name(name)
                .spawn(move || serve(r, u))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// 3proxy(8)'s DESCRIPTION names every service the table serves, so
    /// it never again says fewer are implemented than are.
    #[test]
    fn the_man_page_description_names_every_service() {
        let man = include_str!("../../man/3proxy.8");
        let start = man.find(".SH DESCRIPTION").expect("a DESCRIPTION");
        let end = start
            + man[start..]
                .find("\n.SH OPTIONS")
                .expect("OPTIONS after it");
        let text = &man[start..end];
        for e in super::SERVICES {
            let name = e.def.name;
            let named = text.lines().any(|l| {
                let mut w = l.split_whitespace();
                matches!(w.next(), Some(".B" | ".BR")) && w.next() == Some(name)
            });
            assert!(named, "3proxy(8) DESCRIPTION does not name '{name}'");
        }
    }
}
