//! `auto`: one port for SOCKS, the HTTP proxy and tlspr (3proxy's
//! auto.c). The client's first byte picks the handler: 4 or 5 is SOCKS,
//! 22 (a TLS handshake record) is tlspr, anything else the HTTP proxy.
//! The byte is only peeked, so the handler reads the whole request
//! itself. A client that sends nothing within CONNECTION_SHORT is closed
//! with 801, logged as `AUTO`; the others are logged under the name of
//! the handler that served them.

use std::os::fd::AsFd;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::MsgFlags;

use crate::client::Client;
use crate::res::Res;
use crate::timeouts::Timeouts;

/// Nothing came before the timeout, or the client closed first.
const NO_BYTE: Res = Res::AUTO_NO_BYTE;

/// The client thread's work for one auto client.
pub fn serve(c: &mut Client, _: &[u8], _: Option<&crate::parent::Known>) -> crate::parent::Next {
    let svc = c.svc().clone();
    let wait = svc.timeouts.get(Timeouts::CONNECTION_SHORT);
    let Some(first) = peek_first(c, wait) else {
        c.record.res = NO_BYTE;
        return crate::parent::Next::Done;
    };
    match first {
        4 | 5 => super::socks::serve(c, &[], None),
        22 => {
            c.service_name = Some("TLSPR");
            super::tlspr::serve(c, &[], None)
        }
        _ => {
            c.service_name = Some("PROXY");
            super::proxy::serve(c, &[], None)
        }
    }
}

/// The first byte the client sent, left in the socket.
fn peek_first(c: &Client, wait: std::time::Duration) -> Option<u8> {
    let ms = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
    let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
    let mut fds = [PollFd::new(c.cli.as_fd(), PollFlags::POLLIN)];
    let mut b = [0u8; 1];
    let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
    // Under TLS, readable may be part of a record only: poll again.
    let deadline = std::time::Instant::now() + wait;
    loop {
        if !c.cli.buffered() {
            match poll(&mut fds, timeout) {
                Err(nix::errno::Errno::EINTR) => continue,
                Ok(n) if n > 0 => {}
                _ => return None,
            }
        }
        match c.cli.recv_flags(&mut b, flags) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if c.cli.is_tls() && e.kind() == std::io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() >= deadline {
                    return None;
                }
            }
            Ok(1) => return Some(b[0]),
            _ => return None,
        }
    }
}
