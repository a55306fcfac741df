//! A service's settings, below every layer that serves it (3proxy's
//! `srvparam` and `proxymain.c`'s option parsing): the table's facts about
//! a service ([`ServiceDef`]), a service line's options ([`ServiceOpts`]),
//! and [`Service`], the snapshot of the cfg a service's acceptor and client
//! threads share read-only through an `Arc`. A service line is turned into
//! a [`Prepared`] (settings and bound socket) until the whole cfg has
//! loaded (`conf::service_cmds`), then started (`services::start`).
//!
//! Invariant: nothing here serves a client; the code of each service and
//! the table that finds it are in `services`, above.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};

use crate::conf::token::quote;
use crate::conf::value::number;
use crate::log::Sink;
use crate::logformat::LogFormat;
use crate::net::{Addr, Dialer, Family, Target};
use crate::sys::sockopt::SockOpts;
use crate::timeouts::Timeouts;

/// What the service table says of a service (3proxy's `proxydef`), but
/// its code: the table with the code is `services::SERVICES`.
#[derive(Debug)]
pub struct ServiceDef {
    /// The cfg command.
    pub name: &'static str,
    /// `%N` in the log.
    pub log_name: &'static str,
    pub default_port: u16,
    /// Positional arguments after the options (tcppm: LPORT HOST RPORT).
    pub positional: usize,
    /// A UDP service: it gets a datagram socket, not a listener.
    pub udp: bool,
}

/// Per-service log choice (`-l`, `-lFILE`, `-l@ident`); None in
/// `ServiceOpts` means the global `log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogOpt {
    Stdout,
    File(String),
    /// Syslog with this ident (3proxy does this only in its standalone
    /// binaries; inside 3proxy it logs to the global target instead).
    Syslog(String),
}

/// `-g<traff>,<num>,<delay>`: slow down a direction that makes many tiny
/// reads (3proxy's "grace" to stop busy loops on trickling peers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grace {
    pub bytes: u32,
    pub reads: u32,
    pub delay_ms: u32,
}

/// Everything a service line's options say (3proxy.cfg(5) "service
/// options"). Every service's options are parsed here, those another
/// service ignores too, so one parser serves every service.
#[derive(Debug, Clone, Default)]
pub struct ServiceOpts {
    pub port: Option<u16>,
    pub internal: Option<String>,
    pub ext4: Option<IpAddr>,
    pub ext6: Option<IpAddr>,
    pub family: Option<Family>,
    pub log: Option<LogOpt>,
    pub logformat: Option<String>,
    /// `-d`: go to the background, like `daemon`.
    pub daemon: bool,
    /// `-C`: end the session at the first close instead of half-closing.
    pub session_end: bool,
    /// `-s[N]`: Some(n) when given (`-s` alone is 1, `-s0` is 0).
    pub s_option: Option<u32>,
    pub bufsize: Option<usize>,
    pub stack_add: Option<i64>,
    pub grace: Option<Grace>,
    pub oc: SockOpts,
    pub os: SockOpts,
    pub ol: SockOpts,
    /// `-t`: no start/stop records in the log.
    pub silent: bool,
    /// `-H`: read a PROXY protocol v1 line first.
    pub proxy_header: bool,
    pub dev_in: Option<String>,
    pub dev_out: Option<String>,
    pub ns_in: Option<PathBuf>,
    pub ns_out: Option<PathBuf>,
    /// `-a`, `-a1`, `-a2` (HTTP proxy headers), kept for the proxy service.
    pub anonymous: Option<u32>,
    /// `-u`, `-u2` (needuser), kept for proxy/socks.
    pub needuser: Option<u32>,
    /// `-Ne<ip>` (or `-N<ip>`): the address socks reports in CONNECT and
    /// BIND replies instead of its own (IP-to-IP NAT).
    pub nat_ext: Option<IpAddr>,
    /// `-Ni<ip>`: the address socks reports in UDP ASSOCIATE replies.
    pub nat_int: Option<IpAddr>,
    /// `-U[MODE]`: socks UDP, on a destination change: bit 1 log, bit 2
    /// authorize. None is the default, 3.
    pub udp_mode: Option<u32>,
    /// `-r<host:port>`: connect-back client; dial out instead of listening
    /// (see `crate::connectback`).
    pub connect_to: Option<SocketAddr>,
    /// `-R<host:port>`: connect-back listener; server sockets come from
    /// back-connections accepted there.
    pub back_listen: Option<SocketAddr>,
    /// `-or`, `-oR`: options of the connect-back client and listening
    /// sockets.
    pub cb_client: SockOpts,
    pub cb_listen: SockOpts,
    /// Options for later services, stored raw: `-h`, `-P`,
    /// `-c`, `-x`, `-X`, `-F`, `-T`.
    pub other: Vec<String>,
    pub positional: Vec<String>,
    /// What 3proxy accepts leniently in these options (`-ilocalhost`):
    /// one warning each, for the cfg loader to report (`State::lenient`).
    pub warnings: Vec<String>,
}

impl ServiceOpts {
    /// Parse a service line's arguments (after the command name). Values are
    /// glued to their letter, as in 3proxy (`-p8080`).
    pub fn parse(args: &[String], maxseg: u32) -> Result<ServiceOpts, String> {
        let mut o = ServiceOpts::default();
        for a in args {
            let Some(opt) = a.strip_prefix('-').filter(|s| !s.is_empty()) else {
                o.positional.push(a.clone());
                continue;
            };
            let (letter, val) = opt.split_at(1);
            let bad = || format!("bad option '{}'", quote(a));
            match letter {
                "p" => o.port = Some(number(val, 0u16, 65535)?),
                "i" => {
                    let (addr, why) = crate::conf::value::listen_addr(val)?;
                    o.internal = Some(addr);
                    o.warnings.extend(why.map(|w| format!("-i: {w}")));
                }
                "e" => {
                    let (ip, why) = crate::conf::value::named_ip(val)?;
                    o.warnings.extend(why.map(|w| format!("-e: {w}")));
                    match ip {
                        IpAddr::V4(_) => o.ext4 = Some(ip),
                        IpAddr::V6(_) => o.ext6 = Some(ip),
                    }
                }
                "4" | "6" => {
                    o.family = Some(match opt {
                        "4" => Family::V4,
                        "6" => Family::V6,
                        "46" => Family::V46,
                        "64" => Family::V64,
                        _ => return Err(bad()),
                    })
                }
                "l" => {
                    o.log = Some(if val.is_empty() {
                        LogOpt::Stdout
                    } else if let Some(ident) = val.strip_prefix('@') {
                        LogOpt::Syslog(ident.to_string())
                    } else {
                        LogOpt::File(val.to_string())
                    })
                }
                "f" => o.logformat = Some(val.to_string()),
                "C" => o.session_end = val != "1",
                "s" => {
                    o.s_option = Some(if val.is_empty() {
                        1
                    } else {
                        number(val, 0u32, 1 << 20)?
                    })
                }
                "b" => o.bufsize = Some(number(val, 1024usize, 16 << 20)?),
                "S" => o.stack_add = Some(number(val, -(1i64 << 20), 64 << 20)?),
                "g" => {
                    let v: Vec<&str> = val.split(',').collect();
                    if v.len() != 3 {
                        return Err(format!(
                            "'{}': takes -g<bytes>,<reads>,<delay ms>",
                            quote(a)
                        ));
                    }
                    o.grace = Some(Grace {
                        bytes: number(v[0], 0u32, u32::MAX)?,
                        reads: number(v[1], 1u32, u32::MAX)?,
                        delay_ms: number(v[2], 0u32, 60_000)?,
                    });
                }
                "o" => {
                    let (which, list) = val.split_at(val.len().min(1));
                    let parsed = SockOpts::parse(list, maxseg)
                        .map_err(|e| format!("'{}': {e}", quote(a)))?;
                    match which {
                        "c" => o.oc = parsed,
                        "s" => o.os = parsed,
                        "l" => o.ol = parsed,
                        "r" => o.cb_client = parsed,
                        "R" => o.cb_listen = parsed,
                        _ => return Err(bad()),
                    }
                }
                "t" => o.silent = true,
                "H" => o.proxy_header = true,
                "D" | "n" => {
                    let (which, v) = val.split_at(val.len().min(1));
                    match (letter, which) {
                        // A bare -n is 3proxy's old NTLM switch: ignored.
                        ("n", "") => {}
                        ("D", "i") if !v.is_empty() => o.dev_in = Some(v.to_string()),
                        ("D", "e") if !v.is_empty() => o.dev_out = Some(v.to_string()),
                        ("n", "i") if !v.is_empty() => o.ns_in = Some(PathBuf::from(v)),
                        ("n", "e") if !v.is_empty() => o.ns_out = Some(PathBuf::from(v)),
                        _ => return Err(bad()),
                    }
                }
                "a" => {
                    o.anonymous = Some(if val.is_empty() {
                        0
                    } else {
                        number(val, 1u32, 2)?
                    })
                }
                "u" => {
                    o.needuser = Some(if val.is_empty() {
                        0
                    } else {
                        number(val, 0u32, 2)?
                    })
                }
                "N" => {
                    let (slot, v) = match val.split_at(val.len().min(1)) {
                        ("e", v) => (&mut o.nat_ext, v),
                        ("i", v) => (&mut o.nat_int, v),
                        _ => (&mut o.nat_ext, val),
                    };
                    *slot = Some(
                        crate::net::parse_ip(v)
                            .ok_or_else(|| format!("'{}': takes an IP address", quote(a)))?,
                    );
                }
                "U" => {
                    o.udp_mode = Some(if val.is_empty() {
                        0
                    } else {
                        number(val, 0u32, 3)?
                    })
                }
                "h" | "P" | "c" | "x" | "X" | "F" | "T" => o.other.push(a.clone()),
                "d" => o.daemon = true,
                "r" => {
                    o.connect_to = Some(
                        crate::connectback::parse_hostport(val).map_err(|e| format!("-r: {e}"))?,
                    )
                }
                "R" => {
                    o.back_listen = Some(
                        crate::connectback::parse_hostport(val).map_err(|e| format!("-R: {e}"))?,
                    )
                }
                "I" => return Err("'-I' (inetd mode) is not supported".into()),
                _ => return Err(format!("unknown option '{}'", quote(a))),
            }
        }
        Ok(o)
    }
}

/// A running service's settings: the snapshot of the cfg at its line plus
/// its own options. Shared read-only by its acceptor and clients.
pub struct Service {
    pub def: &'static ServiceDef,
    /// The key of its listening socket (`running`), across reloads.
    pub key: String,
    /// `logdump`: (client to server, server to client) bytes after which a
    /// session in progress writes a record; 0 is off. Process-wide.
    pub logdump: (u64, u64),
    /// `delimchar`: splits `user@host` logins (pop3p). Process-wide, set
    /// with `logdump` after the whole cfg has run.
    pub delimchar: u8,
    pub opts: ServiceOpts,
    pub timeouts: Timeouts,
    pub maxconn: u32,
    /// `reclaim`: at `maxconn`, a client waiting in the backlog takes the
    /// slot of an idle or slow one (`live::pressure::reclaim`).
    pub reclaim: bool,
    /// What the live registry needs for `reclaim` and `minrate` (its
    /// `key` is set per client, from the slot's service).
    pub guard: crate::live::Guard,
    pub listen: Addr,
    /// The destination of a port mapper.
    pub target: Option<Target>,
    pub family: Family,
    pub dialer: Dialer,
    pub log: Option<Arc<Sink>>,
    pub logformat: Arc<LogFormat>,
    pub bufsize: usize,
    /// Stack size of client threads: 3proxy's base plus `stacksize`/`-S`.
    pub stack_size: usize,
    /// `parklinger`: a relay quiet this long parks (its thread is freed,
    /// `park`); zero never parks.
    pub park_linger: std::time::Duration,
    /// Slots taken (clients being served, and threads waiting in accept()
    /// for one), and the threads waiting for a slot to be freed.
    pub live: Mutex<u32>,
    pub left: Condvar,
    /// Threads waiting on `left` for a slot.
    pub slot_waiters: std::sync::atomic::AtomicU32,
    /// `auth`, ACL, users and limits as they stood at the service's line.
    pub access: crate::access::Policy,
    /// `transparent` (TransparentPlugin) was on at the service's line:
    /// a client netfilter redirected goes where it meant to go.
    pub transparent: bool,
    /// TrafficPlugin's `trafcorrect` rules, for a service after its
    /// `plugin` line (set after the whole cfg has run); None: records
    /// say the bytes as they are.
    pub traffic: Option<Arc<crate::traffic::Rules>>,
    /// `-R`: where server sockets come from (connect-back listener).
    pub back_listener: Option<Arc<crate::connectback::BackListener>>,
    /// `pcre` filters as they stood at the service's line; None if none.
    pub filters: Option<Arc<crate::filter::Filters>>,
    /// `filtermaxsize`: process-wide, set after the whole cfg has run.
    pub filtermaxsize: usize,
    /// StringsPlugin's texts (None: all built in); process-wide, set
    /// after the whole cfg has run.
    pub strings: Option<Arc<crate::stringtable::Strings>>,
    /// `ssl_serv` at the service's line: clients speak TLS (the
    /// certificate, key and client verification as they stood there).
    pub tls_server: Option<Arc<rustls::ServerConfig>>,
    /// TLS towards parents whose type ends in `s` (the `ssl_client_*`
    /// settings at the service's line).
    pub tls_client: Option<Arc<crate::tls::Client>>,
    /// The counters `/metrics` shows for this service: by name and port,
    /// so the same ones across reloads.
    pub metrics: Arc<crate::metrics::ServiceCounters>,
    /// `ssl_mitm` at the service's line: the CA, the certificates made so
    /// far (shared by the service's clients) and TLS to the origins.
    pub mitm: Option<Arc<crate::tls::mitm::Mitm>>,
}

impl Service {
    /// The service's listening port, for `%p`.
    pub fn port(&self) -> u16 {
        self.listen.port()
    }

    /// Splice relay asked for (`-s` on a TCP service).
    pub fn splice(&self) -> bool {
        matches!(self.opts.s_option, Some(n) if n > 0)
    }
}

impl crate::access::Scope for Service {
    fn policy(&self) -> &crate::access::Policy {
        &self.access
    }

    fn listen_ip(&self) -> Option<SocketAddr> {
        match &self.listen {
            Addr::Ip(a) => Some(*a),
            _ => None,
        }
    }

    fn key(&self) -> &str {
        &self.key
    }
}

/// 3proxy's per-thread stack base (`BASESTACKSIZE`); `stacksize` and `-S`
/// add to it. Relay buffers live on the heap, so the stack holds only
/// frames; resolving a name through glibc is the deepest path.
pub const BASE_STACK: i64 = 49152;
/// What a service under `ssl_serv` or with TLS parents adds to its
/// threads' stacks: the TLS
/// handshake (the signature with the server key, certificate checks)
/// runs deeper than any plain path. Only the pages a thread touches cost
/// memory.
pub const TLS_STACK: i64 = 131072;
/// Smallest stack we will start a thread with.
pub const MIN_STACK: i64 = 32768;
/// Default relay buffer per direction (3proxy's TCPBUFSIZE).
pub const DEFAULT_BUFSIZE: usize = 65536;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<ServiceOpts, String> {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        ServiceOpts::parse(&args, 1400)
    }

    #[test]
    fn options_glue_their_values() {
        let o =
            parse("-p8080 -i127.0.0.1 -e10.0.0.1 -e::1 -C -s -b4096 -S8192 -t -H 1 h 2").unwrap();
        assert_eq!(o.port, Some(8080));
        assert_eq!(o.internal.as_deref(), Some("127.0.0.1"));
        assert_eq!(o.ext4, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(o.ext6, Some("::1".parse().unwrap()));
        assert!(o.session_end && o.silent && o.proxy_header);
        assert_eq!(o.s_option, Some(1));
        assert_eq!(o.bufsize, Some(4096));
        assert_eq!(o.stack_add, Some(8192));
        assert_eq!(o.positional, ["1", "h", "2"]);
    }

    #[test]
    fn family_flags() {
        assert_eq!(parse("-4").unwrap().family, Some(Family::V4));
        assert_eq!(parse("-6").unwrap().family, Some(Family::V6));
        assert_eq!(parse("-46").unwrap().family, Some(Family::V46));
        assert_eq!(parse("-64").unwrap().family, Some(Family::V64));
        assert!(parse("-66").is_err());
    }

    #[test]
    fn s_and_c_variants() {
        assert_eq!(parse("-s0").unwrap().s_option, Some(0));
        assert!(!parse("-C1").unwrap().session_end);
        assert!(parse("-C").unwrap().session_end);
    }

    #[test]
    fn logs_and_formats() {
        assert_eq!(parse("-l").unwrap().log, Some(LogOpt::Stdout));
        assert_eq!(
            parse("-l/tmp/x").unwrap().log,
            Some(LogOpt::File("/tmp/x".into()))
        );
        assert_eq!(parse("-fL%N").unwrap().logformat.as_deref(), Some("L%N"));
        assert_eq!(
            parse("-l@ident").unwrap().log,
            Some(LogOpt::Syslog("ident".into()))
        );
    }

    #[test]
    fn socket_options_and_devices() {
        let o = parse("-ocTCP_NODELAY -osSO_KEEPALIVE -olSO_REUSEADDR -Dieth0 -Detun0").unwrap();
        assert!(!o.oc.is_empty() && !o.os.is_empty() && !o.ol.is_empty());
        assert_eq!(o.dev_in.as_deref(), Some("eth0"));
        assert_eq!(o.dev_out.as_deref(), Some("tun0"));
        assert!(parse("-oxTCP_NODELAY").is_err());
    }

    #[test]
    fn grace() {
        let o = parse("-g8000,3,10").unwrap();
        assert_eq!(
            o.grace,
            Some(Grace {
                bytes: 8000,
                reads: 3,
                delay_ms: 10
            })
        );
        assert!(parse("-g1,2").is_err());
    }

    #[test]
    fn unknown_and_unbuilt_options() {
        assert!(parse("-Z").unwrap_err().contains("unknown option"));
        assert!(parse("-d").unwrap().daemon);
        assert!(parse("-rhost").unwrap_err().contains("host:port"));
        assert!(parse("-n").is_ok());
        assert!(parse("-Nexyz").is_err());
        assert!(parse("-U4").is_err());
    }

    #[test]
    fn connect_back() {
        let o = parse("-r127.0.0.1:9000 -R[::1]:9001 -orSO_KEEPALIVE -oRTCP_NODELAY").unwrap();
        assert_eq!(o.connect_to, Some("127.0.0.1:9000".parse().unwrap()));
        assert_eq!(o.back_listen, Some("[::1]:9001".parse().unwrap()));
        assert!(!o.cb_client.is_empty() && !o.cb_listen.is_empty());
        assert!(parse("-r127.0.0.1:0").is_err());
    }

    #[test]
    fn socks_nat_and_udp_mode() {
        let o = parse("-Ne10.0.0.1 -Ni10.0.0.2 -U1").unwrap();
        assert_eq!(o.nat_ext, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(o.nat_int, Some("10.0.0.2".parse().unwrap()));
        assert_eq!(o.udp_mode, Some(1));
        let o = parse("-N::1 -U").unwrap();
        assert_eq!(o.nat_ext, Some("::1".parse().unwrap()));
        assert_eq!(o.udp_mode, Some(0));
        assert!(parse("-pxyz").is_err());
    }
}
