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
