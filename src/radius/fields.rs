//! What a request says of a session: the attributes 3proxy's `radsend`
//! fills in, and its Acct-Session-Id.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use crate::proto::radius::{self as wire, attr, Builder};

/// What the proxy knows about a client when it asks or accounts: the
/// attributes 3proxy's `radsend` fills in.
#[derive(Debug, Clone, Default)]
pub struct Fields {
    pub user: Option<String>,
    /// The client's address: Framed-IP-Address as 3proxy sends it, and
    /// Calling-Station-Id.
    pub client: Option<SocketAddr>,
    /// The address the client reached: NAS-IP-Address (NAS-IPv6-Address);
    /// the service's port is NAS-Port.
    pub local: Option<SocketAddr>,
    pub nas_port: u16,
    /// NAS-Identifier: the service's log name (PROXY, SOCK5, ...).
    pub nas_id: String,
    /// Called-Station-Id: the destination host as asked.
    pub host: Option<String>,
    /// Login-IP-Host (Login-IPv6-Host) and Login-TCP-Port.
    pub dst: Option<IpAddr>,
    pub port: u16,
    /// Login-Service: the operation's bits shifted by 8, as 3proxy sends
    /// (Access-Request only: a record does not keep its operation).
    pub op: Option<u32>,
    pub session_id: String,
}

impl Fields {
    /// The same fields, borrowed.
    pub fn view(&self) -> View<'_> {
        View {
            user: self.user.as_deref(),
            client: self.client,
            local: self.local,
            nas_port: self.nas_port,
            nas_id: &self.nas_id,
            host: self.host.as_deref(),
            dst: self.dst,
            port: self.port,
            op: self.op,
            session_id: self.session_id.as_bytes(),
        }
    }
}

/// [`Fields`] borrowed from where the proxy keeps them: what a client
/// thread encodes an Accounting-Request from without copying them.
#[derive(Debug, Clone, Copy, Default)]
pub struct View<'a> {
    pub user: Option<&'a str>,
    pub client: Option<SocketAddr>,
    pub local: Option<SocketAddr>,
    pub nas_port: u16,
    pub nas_id: &'a str,
    pub host: Option<&'a str>,
    pub dst: Option<IpAddr>,
    pub port: u16,
    pub op: Option<u32>,
    /// Acct-Session-Id (text).
    pub session_id: &'a [u8],
}

impl View<'_> {
    pub(super) fn add_to(&self, b: &mut Builder) {
        b.add(attr::ACCT_SESSION_ID, self.session_id);
        b.add_u32(attr::NAS_PORT_TYPE, wire::PORT_VIRTUAL);
        b.add_u32(attr::NAS_PORT, u32::from(self.nas_port));
        if let Some(l) = self.local {
            b.add_ip(attr::NAS_IP_ADDRESS, attr::NAS_IPV6_ADDRESS, l.ip());
        }
        b.add(attr::NAS_IDENTIFIER, self.nas_id.as_bytes());
        if let Some(c) = self.client {
            b.add_ip(attr::FRAMED_IP_ADDRESS, attr::FRAMED_IPV6_ADDRESS, c.ip());
            add_ip_text(b, attr::CALLING_STATION_ID, c.ip().to_canonical());
        }
        if let Some(h) = &self.host {
            b.add(attr::CALLED_STATION_ID, h.as_bytes());
        }
        if let Some(op) = self.op {
            b.add_u32(attr::LOGIN_SERVICE, op);
        }
        b.add_u32(attr::LOGIN_TCP_PORT, u32::from(self.port));
        if let Some(d) = self.dst {
            b.add_ip(attr::LOGIN_IP_HOST, attr::LOGIN_IPV6_HOST, d);
        }
        if let Some(u) = &self.user {
            b.add(attr::USER_NAME, u.as_bytes());
        }
    }
}

/// An address as text (`addr::ip_text`'s form), an IPv4 one without
/// allocating.
fn add_ip_text(b: &mut Builder, t: u8, ip: IpAddr) {
    let IpAddr::V4(v4) = ip else {
        b.add(t, crate::addr::ip_text(ip).as_bytes());
        return;
    };
    let mut text = [0u8; 15];
    let mut n = 0;
    for (i, o) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            text[n] = b'.';
            n += 1;
        }
        if o >= 100 {
            text[n] = b'0' + o / 100;
            n += 1;
        }
        if o >= 10 {
            text[n] = b'0' + o / 10 % 10;
            n += 1;
        }
        text[n] = b'0' + o % 10;
        n += 1;
    }
    b.add(t, &text[..n]);
}

/// A new Acct-Session-Id: seconds, milliseconds of the start and a
/// process-wide counter (3proxy: seconds, milliseconds, thread id).
pub fn session_id(start: SystemTime) -> String {
    let d = start
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{}.{}.{}",
        d.as_secs(),
        d.subsec_millis(),
        SESSION_N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The counter at the end of Acct-Session-Ids.
static SESSION_N: AtomicU64 = AtomicU64::new(0);

/// An Acct-Session-Id kept inline (a session's requests copy it without
/// allocating): at most [`SessionId::MAX`] bytes, cut there.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SessionId {
    len: u8,
    buf: [u8; SessionId::MAX],
}

impl SessionId {
    /// Longest id kept: ours ("seconds.millis.counter") take at most 35.
    pub const MAX: usize = 47;

    /// A new id for a session that starts at `start` (as [`session_id`]).
    pub fn new(start: SystemTime) -> SessionId {
        let d = start
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let mut s = SessionId {
            len: 0,
            buf: [0; SessionId::MAX],
        };
        let n = SESSION_N.fetch_add(1, Ordering::Relaxed);
        for (i, v) in [d.as_secs(), u64::from(d.subsec_millis()), n]
            .into_iter()
            .enumerate()
        {
            if i > 0 {
                s.push(b'.');
            }
            s.push_number(v);
        }
        s
    }

    fn push(&mut self, b: u8) {
        if usize::from(self.len) < SessionId::MAX {
            self.buf[usize::from(self.len)] = b;
            self.len += 1;
        }
    }

    /// `v` in decimal, as `format!` writes it.
    fn push_number(&mut self, v: u64) {
        let mut digits = [0u8; 20];
        for &d in crate::addr::decimal(v, &mut digits) {
            self.push(d);
        }
    }

    /// The id an Access-Request carried (cut at [`SessionId::MAX`] bytes,
    /// at a character boundary).
    pub fn from_text(t: &str) -> SessionId {
        let mut n = t.len().min(SessionId::MAX);
        while !t.is_char_boundary(n) {
            n -= 1;
        }
        let mut s = SessionId {
            len: n as u8,
            buf: [0; SessionId::MAX],
        };
        s.buf[..n].copy_from_slice(&t.as_bytes()[..n]);
        s
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn session_ids_read_as_format_writes_them() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_042);
        let a = SessionId::new(t);
        let (head, n) = a.as_str().rsplit_once('.').unwrap();
        assert_eq!(head, "1700000000.42");
        let b = SessionId::new(t);
        let m: u64 = b.as_str().rsplit_once('.').unwrap().1.parse().unwrap();
        assert!(m > n.parse::<u64>().unwrap());
        assert_eq!(
            SessionId::new(SystemTime::UNIX_EPOCH)
                .as_str()
                .split('.')
                .next(),
            Some("0")
        );
        assert_eq!(SessionId::from_text("1.2.3").as_str(), "1.2.3");
        let long = "é".repeat(40);
        assert_eq!(SessionId::from_text(&long).as_str(), "é".repeat(23));
    }
}
