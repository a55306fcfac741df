//! Socket options named in the cfg (`-oc`, `-os`, `-ol`), and setting an
//! integer option by number (3proxy's `sockopts[]` table in proxymain.c).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// One option a user can name in `-oc/-os/-ol`: its cfg name, level, and
/// number. TCP_MAXSEG takes its value from `maxseg`; the others are set to 1.
struct NamedOpt {
    name: &'static str,
    level: libc::c_int,
    opt: libc::c_int,
}

const TABLE: &[NamedOpt] = &[
    NamedOpt {
        name: "TCP_NODELAY",
        level: libc::IPPROTO_TCP,
        opt: libc::TCP_NODELAY,
    },
    NamedOpt {
        name: "TCP_CORK",
        level: libc::IPPROTO_TCP,
        opt: libc::TCP_CORK,
    },
    NamedOpt {
        name: "TCP_DEFER_ACCEPT",
        level: libc::IPPROTO_TCP,
        opt: libc::TCP_DEFER_ACCEPT,
    },
    NamedOpt {
        name: "TCP_QUICKACK",
        level: libc::IPPROTO_TCP,
        opt: libc::TCP_QUICKACK,
    },
    NamedOpt {
        name: "TCP_TIMESTAMPS",
        level: libc::IPPROTO_TCP,
        opt: libc::TCP_TIMESTAMP,
    },
    NamedOpt {
        name: "SO_REUSEADDR",
        level: libc::SOL_SOCKET,
        opt: libc::SO_REUSEADDR,
    },
    NamedOpt {
        name: "SO_REUSEPORT",
        level: libc::SOL_SOCKET,
        opt: libc::SO_REUSEPORT,
    },
    NamedOpt {
        name: "SO_KEEPALIVE",
        level: libc::SOL_SOCKET,
        opt: libc::SO_KEEPALIVE,
    },
    NamedOpt {
        name: "SO_DONTROUTE",
        level: libc::SOL_SOCKET,
        opt: libc::SO_DONTROUTE,
    },
    NamedOpt {
        name: "IP_TRANSPARENT",
        level: libc::SOL_IP,
        opt: libc::IP_TRANSPARENT,
    },
    NamedOpt {
        name: "TCP_FASTOPEN_CONNECT",
        level: libc::IPPROTO_TCP,
        opt: libc::TCP_FASTOPEN_CONNECT,
    },
    NamedOpt {
        name: "TCP_FASTOPEN",
        level: libc::IPPROTO_TCP,
        opt: libc::TCP_FASTOPEN,
    },
    // Ours, not 3proxy's: `-olIPV6_V6ONLY` makes a `::` listener IPv6
    // only (by default it takes IPv4 clients too, as 3proxy's does).
    NamedOpt {
        name: "IPV6_V6ONLY",
        level: libc::IPPROTO_IPV6,
        opt: libc::IPV6_V6ONLY,
    },
    NamedOpt {
        name: "TCP_MAXSEG",
        level: libc::IPPROTO_TCP,
        opt: libc::TCP_MAXSEG,
    },
];

/// Options 3proxy accepts by name but that have no meaning on Linux
/// (Windows and BSD ones): accepted and ignored, so old cfgs keep working.
const IGNORED: &[&str] = &[
    "SO_EXCLUSIVEADDRUSE",
    "SO_PORT_SCALABILITY",
    "SO_REUSE_UNICASTPORT",
];

/// A parsed `-o?` list: (level, option, value) triples.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SockOpts(Vec<(libc::c_int, libc::c_int, libc::c_int)>);

impl SockOpts {
    /// Parse an option list. Like 3proxy, names are found by substring, so
    /// any separator works (`TCP_NODELAY,SO_KEEPALIVE`). A word that names
    /// no option is an error (3proxy ignores it silently).
    pub fn parse(list: &str, maxseg: u32) -> Result<SockOpts, String> {
        let mut out = Vec::new();
        for word in list.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.is_empty() || IGNORED.contains(&word) {
                continue;
            }
            let Some(o) = TABLE.iter().find(|o| o.name == word) else {
                return Err(format!(
                    "unknown socket option '{}'",
                    crate::conf::token::quote(word)
                ));
            };
            let value = if o.opt == libc::TCP_MAXSEG && o.level == libc::IPPROTO_TCP {
                if maxseg == 0 {
                    return Err("TCP_MAXSEG needs a 'maxseg' command before it".into());
                }
                maxseg as libc::c_int
            } else {
                1
            };
            out.push((o.level, o.opt, value));
        }
        Ok(SockOpts(out))
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Apply every option. Errors from options the socket's family does not
    /// support (TCP options on a unix socket) are ignored, as 3proxy does.
    pub fn apply(&self, fd: BorrowedFd<'_>) {
        for &(level, opt, value) in &self.0 {
            let _ = set_int(fd, level, opt, value);
        }
    }
}

/// setsockopt() with an int value.
pub fn set_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    opt: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `fd` is a live descriptor for the borrow's duration; the value
    // pointer and length describe a c_int on our stack that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The destination a connection had before netfilter's NAT rewrote it
/// (`SO_ORIGINAL_DST`, `IP6T_SO_ORIGINAL_DST`): where a client redirected
/// by an iptables/nftables REDIRECT or DNAT rule meant to go. `v6` picks
/// the IPv6 table. Fails (ENOENT) when conntrack has no entry for it.
pub fn original_dst(fd: BorrowedFd<'_>, v6: bool) -> io::Result<std::net::SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
    // SAFETY: sockaddr_in6 is plain old data for which all-zero bytes are
    // a valid value; it is as large as sockaddr_in, so either answer fits.
    let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    let (level, opt, size) = if v6 {
        (
            libc::SOL_IPV6,
            libc::IP6T_SO_ORIGINAL_DST,
            std::mem::size_of::<libc::sockaddr_in6>(),
        )
    } else {
        (
            libc::SOL_IP,
            libc::SO_ORIGINAL_DST,
            std::mem::size_of::<libc::sockaddr_in>(),
        )
    };
    let mut len = size as libc::socklen_t;
    // SAFETY: `fd` is live for the borrow; the kernel writes at most `len`
    // bytes into `sa`, which is at least that large and outlives the call,
    // and stores the length it wrote back into `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&mut sa as *mut libc::sockaddr_in6).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let family = libc::c_int::from(sa.sin6_family);
    if v6 && family == libc::AF_INET6 {
        let ip = Ipv6Addr::from(sa.sin6_addr.s6_addr);
        let port = u16::from_be(sa.sin6_port);
        return Ok(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, 0)));
    }
    if !v6 && family == libc::AF_INET {
        // SAFETY: the kernel wrote a sockaddr_in (family AF_INET) at the
        // start of `sa`, which is larger and suitably aligned for it.
        let sin: libc::sockaddr_in =
            unsafe { std::ptr::read((&sa as *const libc::sockaddr_in6).cast()) };
        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        let port = u16::from_be(sin.sin_port);
        return Ok(SocketAddr::V4(SocketAddrV4::new(ip, port)));
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "SO_ORIGINAL_DST gave an unexpected address family",
    ))
}

/// A socket named by its descriptor number, borrowed from another thread
/// for [`shutdown_both`]: the live-session registry (`crate::live`) keeps
/// the numbers of a session's sockets so the admin page can end it.
pub struct ForeignFd(std::os::fd::RawFd);

impl ForeignFd {
    /// Keep `fd`'s number. Whoever makes one promises to drop it (under a
    /// lock [`shutdown_both`]'s callers also take) before the descriptor
    /// is closed.
    pub fn new(fd: BorrowedFd<'_>) -> ForeignFd {
        ForeignFd(fd.as_raw_fd())
    }
}

/// shutdown(2) both directions of the socket `fd` names: its peer sees
/// EOF and its owner's next read returns 0 at once.
pub fn shutdown_both(fd: &ForeignFd) {
    // SAFETY: shutdown() reads and writes no memory of ours. The one
    // hazard is the number naming another descriptor than the one it was
    // taken from (closed and reused); `crate::live` rules that out: the
    // session forgets the number under the same lock its caller holds
    // here, before it closes the socket (`live::Registration`'s Drop, and the
    // guard of a relay's server socket).
    unsafe {
        libc::shutdown(fd.0, libc::SHUT_RDWR);
    }
}

/// shutdown(2) the reading side of the socket `fd` names: its owner's
/// next read returns 0 at once, while it may still write (an answer).
pub fn shutdown_read(fd: &ForeignFd) {
    // SAFETY: as `shutdown_both`: no memory of ours is touched, and
    // `crate::live` keeps the number from naming another descriptor.
    unsafe {
        libc::shutdown(fd.0, libc::SHUT_RD);
    }
}

/// How many bytes the socket `fd` has received and its owner not read
/// yet (FIONREAD); 0 when it cannot say.
pub fn pending_bytes(fd: std::os::fd::BorrowedFd<'_>) -> usize {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which points
    // at `n`, alive for the call; the descriptor is borrowed, so open.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n as *mut libc::c_int) };
    if rc < 0 {
        0
    } else {
        n.max(0) as usize
    }
}

/// The names a user can write, for `--help`.
pub fn names() -> impl Iterator<Item = &'static str> {
    TABLE.iter().map(|o| o.name).chain(IGNORED.iter().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_with_any_separator() {
        let o = SockOpts::parse("TCP_NODELAY,SO_KEEPALIVE", 0).unwrap();
        assert_eq!(o.0.len(), 2);
        let o = SockOpts::parse("TCP_NODELAY|SO_KEEPALIVE SO_REUSEPORT", 0).unwrap();
        assert_eq!(o.0.len(), 3);
        // TCP_FASTOPEN_CONNECT is not mistaken for TCP_FASTOPEN.
        let o = SockOpts::parse("TCP_FASTOPEN_CONNECT", 0).unwrap();
        assert_eq!(
            o.0,
            vec![(libc::IPPROTO_TCP, libc::TCP_FASTOPEN_CONNECT, 1)]
        );
    }

    #[test]
    fn maxseg_needs_a_value() {
        assert!(SockOpts::parse("TCP_MAXSEG", 0).is_err());
        let o = SockOpts::parse("TCP_MAXSEG", 1400).unwrap();
        assert_eq!(o.0, vec![(libc::IPPROTO_TCP, libc::TCP_MAXSEG, 1400)]);
    }

    #[test]
    fn unknown_names_are_errors_and_windows_names_are_ignored() {
        assert!(SockOpts::parse("TCP_NODELAYY", 0).is_err());
        assert!(SockOpts::parse("SO_EXCLUSIVEADDRUSE", 0)
            .unwrap()
            .is_empty());
    }
}
