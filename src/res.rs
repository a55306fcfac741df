//! 3proxy result codes (`%E` in the access log), as one type.
//!
//! Mirrors the "Log error codes reference" of 3proxy's documentation: codes
//! are grouped by range, and every service reports the outcome of a session
//! as one of them. The numbers are part of the user-visible interface (log
//! parsers and monitoring depend on them), so they never change.

/// A session's result code. `Res::OK` (0) means a peer closed normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Res(pub u32);

// The table is 3proxy's; services not built yet will use the rest.
#[allow(dead_code)]
impl Res {
    /// Session ended normally: one of the peers closed.
    pub const OK: Res = Res(0);
    /// socket() failed for the outgoing connection.
    pub const SOCKET: Res = Res(11);
    /// bind() failed for the outgoing connection (bad `-e`, bind to device).
    pub const BIND: Res = Res(12);
    /// connect() failed or timed out.
    pub const CONNECT: Res = Res(13);
    /// getpeername()/getsockname() failed.
    pub const PEERNAME: Res = Res(14);
    /// Out of memory or no thread could be started.
    pub const NOMEM: Res = Res(21);
    /// pipe() or splice() failed in the relay.
    pub const SPLICE: Res = Res(90);
    /// poll() failed in the relay.
    pub const POLL: Res = Res(91);
    /// Idle timeout: no data moved for the service's inactivity timeout.
    pub const IDLE: Res = Res(92);
    /// The session closed with data that could not be delivered.
    pub const UNSENT: Res = Res(94);
    /// Read or write error on the client socket.
    pub const CLIENT_ERR: Res = Res(95);
    /// Read or write error on the server socket.
    pub const SERVER_ERR: Res = Res(96);
    /// Errors on both sockets.
    pub const BOTH_ERR: Res = Res(97);
    /// Host not found, or no destination.
    pub const NOHOST: Res = Res(100);
    /// The client's first bytes were not a valid request: for `-H`, a
    /// missing or malformed PROXY protocol line (3proxy's 511, bad request).
    pub const BAD_REQUEST: Res = Res(511);
    /// The destination is the proxy's own listening address (loop).
    pub const LOOP: Res = Res(519);
    /// HTTP: the client closed or went quiet before sending a request.
    pub const HTTP_NO_REQUEST: Res = Res(508);
    /// HTTP: reading a request head failed midway.
    pub const HTTP_NO_REQUEST_ERR: Res = Res(507);
    /// HTTP: a malformed request line or header field (answered 400).
    pub const HTTP_BAD_HEAD: Res = Res(512);
    /// HTTP: an absolute URI with a scheme other than http:// (400).
    pub const HTTP_SCHEME: Res = Res(513);
    /// HTTP: ambiguous or invalid body length: Content-Length with
    /// Transfer-Encoding, differing lengths, an unknown coding (400).
    pub const HTTP_FRAMING: Res = Res(514);
    /// HTTP: no usable destination host or port (400).
    pub const HTTP_BAD_TARGET: Res = Res(515);
    /// HTTP: a head larger than the proxy accepts (431 for requests).
    pub const HTTP_HEAD_TOO_LARGE: Res = Res(516);
    /// HTTP: sending the response to the client failed.
    pub const HTTP_SEND_CLIENT: Res = Res(521);
    /// HTTP: the server's answer was short or malformed (502).
    pub const HTTP_BAD_REPLY: Res = Res(522);
    /// HTTP: bad chunked coding from the server.
    pub const HTTP_CHUNK_SERVER: Res = Res(533);
    /// HTTP: bad chunked coding from the client (400).
    pub const HTTP_CHUNK_CLIENT: Res = Res(537);
    /// Address type not supported (SOCKS).
    pub const NOTIMPL_ATYP: Res = Res(997);
    /// Not implemented.
    pub const NOTIMPL: Res = Res(999);

    // Used by the HTTP proxy (named by the proxy split).
    /// No user name was given where one is required (`-u2`, before the
    /// ACL is asked); HTTP answers 407.
    pub const AUTH_NO_USER: Res = Res(4);
    /// A limit was reached: a traffic quota (`countin`, `countout`,
    /// `countall`), also `connlim` and authcache's `limit`; HTTP answers
    /// 503.
    pub const QUOTA: Res = Res(10);
    /// A `connect` (HTTP CONNECT) parent: sending the CONNECT request to
    /// it failed.
    pub const PARENT_SEND: Res = Res(31);
    /// A `connect` parent: no status line came back, or a short one.
    pub const PARENT_READ: Res = Res(32);
    /// A `connect` parent answered the CONNECT with a status other than
    /// 2xx.
    pub const PARENT_REFUSED: Res = Res(33);

    /// Codes 30-79: a parent proxy failed on the way to the destination
    /// (30-39 `connect` parents, 40-49 SOCKS4, 50-69 SOCKS5, 70 UDP
    /// through a parent that cannot carry it); HTTP answers 502 "Failed
    /// to connect parent proxy".
    pub const fn is_parent_hop(self) -> bool {
        self.0 >= 30 && self.0 < 80
    }
}

impl std::fmt::Display for Res {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:05}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_hop_codes_are_30_to_79() {
        assert!(!Res(29).is_parent_hop());
        assert!(Res::PARENT_SEND.is_parent_hop());
        assert!(Res::PARENT_REFUSED.is_parent_hop());
        assert!(Res(79).is_parent_hop());
        assert!(!Res(80).is_parent_hop());
        assert!(!Res::CONNECT.is_parent_hop());
    }

    #[test]
    fn displays_as_five_digits() {
        assert_eq!(Res::IDLE.to_string(), "00092");
        assert_eq!(Res::LOOP.to_string(), "00519");
    }
}
