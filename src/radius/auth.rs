//! `auth radius`: the Access-Request, asked of each server in turn on
//! the client's thread ([`authenticate`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use super::fields::Fields;
use super::servers::{open, warn_limited, Conf, AUTH};
use crate::proto::radius::{self as wire, attr, Builder, Reply};
use crate::res::Res;

/// What an Access-Accept gave the session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accepted {
    /// Framed-IP-Address: the source of the user's outgoing connections.
    pub framed_ip: Option<IpAddr>,
    /// Session-Timeout: the session ends then, with
    /// [`Res::RADIUS_SESSION_TIMEOUT`].
    pub deadline: Option<Instant>,
    /// Class: echoed in the session's accounting.
    pub class: Vec<Vec<u8>>,
    /// The Acct-Session-Id the Access-Request carried: the session's
    /// accounting uses it too, as 3proxy's does.
    pub session_id: String,
}

/// An identifier for the next request (3proxy counts them too).
fn next_id() -> u8 {
    static ID: AtomicU8 = AtomicU8::new(0);
    ID.fetch_add(1, Ordering::Relaxed)
}

/// A Request Authenticator nobody off this host can predict (RFC 2865
/// section 3): from the OS's CSPRNG (`random`).
fn random_authenticator() -> [u8; 16] {
    let mut out = [0u8; 16];
    crate::random::fill(&mut out);
    out
}

/// `auth radius`: ask the servers about `user` and `password`. Ok with
/// what an Access-Accept gave; Err [`Res::RADIUS_REJECT`] for an
/// Access-Reject (or the code its Reply-Message starts with, as in
/// 3proxy), [`Res::RADIUS_NO_ANSWER`] when no server answered.
pub fn authenticate(conf: &Conf, f: &Fields, password: Option<&str>) -> Result<Accepted, Res> {
    let asked = Instant::now();
    let mut b = Builder::new(wire::ACCESS_REQUEST, next_id(), random_authenticator());
    b.add_u32(attr::SERVICE_TYPE, wire::SERVICE_AUTHENTICATE_ONLY);
    f.view().add_to(&mut b);
    if let Some(pw) = password {
        b.add_password(pw.as_bytes(), &conf.secret);
    }
    let pkt = b.finish_access(&conf.secret);
    if let Some(r) = conf.ask(AUTH, &pkt) {
        return match r.code {
            wire::ACCESS_ACCEPT => Ok(Accepted {
                framed_ip: r.framed_ip,
                deadline: r
                    .session_timeout
                    .filter(|&t| t > 0)
                    .map(|t| asked + Duration::from_secs(u64::from(t))),
                class: r.class,
                session_id: f.session_id.clone(),
            }),
            _ => Err(match r.reply_code {
                // 3proxy takes a numeric Reply-Message for the result.
                Some(n) if n > 0 => Res(n),
                _ => Res::RADIUS_REJECT,
            }),
        };
    }
    warn_limited(&format!(
        "auth radius: no answer from {} server(s) within {:?} each",
        conf.servers.len(),
        conf.wait
    ));
    Err(Res::RADIUS_NO_ANSWER)
}

/// Send `pkt` to `to` and wait for a valid answer, up to `conf.wait`
/// (sending it again once, halfway), on a socket of its own.
fn exchange(conf: &Conf, to: SocketAddr, local: Option<IpAddr>, pkt: &[u8]) -> Option<Reply> {
    let sock = open(to, local)?;
    let start = Instant::now();
    let deadline = start + conf.wait;
    let resend_at = start + conf.wait / 2;
    let mut resent = false;
    let mut buf = vec![0u8; wire::MAX_PACKET];
    if sock.send(pkt).is_err() {
        return None;
    }
    loop {
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        let until = if resent { deadline } else { resend_at };
        let wait = until
            .saturating_duration_since(now)
            .max(Duration::from_millis(1));
        let _ = sock.set_read_timeout(Some(wait));
        match sock.recv(&mut buf) {
            Ok(n) => match wire::parse_reply(&buf[..n], pkt, &conf.secret) {
                Ok(r) => return Some(r),
                // Not ours (the socket is new: nothing late is).
                Err(wire::Fault::Id) => {}
                Err(why) => log::warn!("radius {to}: ignored a reply: {why}"),
            },
            Err(e) if crate::addr::is_timeout(&e) => {
                if !resent {
                    resent = true;
                    let _ = sock.send(pkt);
                }
            }
            // ICMP port unreachable: nobody listens there.
            Err(_) => return None,
        }
    }
}

impl Conf {
    /// Ask the servers in [`Conf::order`] until one gives a valid answer.
    fn ask(&self, which: usize, pkt: &[u8]) -> Option<Reply> {
        for i in self.order(which) {
            let s = &self.servers[i];
            let to = if which == AUTH { s.auth } else { s.acct };
            let r = exchange(self, to, s.local, pkt);
            self.mark(i, which, r.is_some());
            if r.is_some() {
                return r;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::radius::servers::tests::conf;
    use crate::radius::servers::ACCT;
    use std::net::UdpSocket;

    /// A server on loopback that answers every Access-Request as `code`.
    fn server(secret: &'static [u8], code: u8) -> SocketAddr {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let a = s.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok((n, from)) = s.recv_from(&mut buf) {
                let req = &buf[..n];
                let attrs: &[(u8, &[u8])] = &[(attr::FRAMED_IP_ADDRESS, &[127, 0, 0, 2])];
                let p = crate::proto::radius::tests::reply(code, req, attrs, secret, false);
                let _ = s.send_to(&p, from);
            }
        });
        a
    }

    #[test]
    fn fails_over_and_gives_up_in_time() {
        // A port nobody answers on (bound, never read).
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dead = silent.local_addr().unwrap();
        let good = server(b"sec", wire::ACCESS_ACCEPT);
        let f = Fields::default();
        let t = Instant::now();
        let r = authenticate(&conf(&[dead, good]), &f, Some("pw")).unwrap();
        assert_eq!(r.framed_ip, Some("127.0.0.2".parse().unwrap()));
        assert!(t.elapsed() >= Duration::from_millis(300));
        let t = Instant::now();
        assert_eq!(
            authenticate(&conf(&[dead, dead]), &f, Some("pw")),
            Err(Res::RADIUS_NO_ANSWER)
        );
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(600) && took < Duration::from_secs(2));
        // A server with another secret does not count as an answer.
        let other = server(b"other", wire::ACCESS_ACCEPT);
        assert_eq!(
            authenticate(&conf(&[other]), &f, Some("pw")),
            Err(Res::RADIUS_NO_ANSWER)
        );
        let no = server(b"sec", wire::ACCESS_REJECT);
        assert_eq!(
            authenticate(&conf(&[no, good]), &f, Some("pw")),
            Err(Res::RADIUS_REJECT)
        );
    }

    #[test]
    fn a_server_that_failed_is_asked_last_for_a_while() {
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dead = silent.local_addr().unwrap();
        let good = server(b"sec", wire::ACCESS_ACCEPT);
        let c = conf(&[dead, good]);
        let f = Fields::default();
        assert!(authenticate(&c, &f, Some("pw")).is_ok());
        assert_eq!(c.order(AUTH), [1, 0]);
        // Accounting keeps its own account of the same server.
        assert_eq!(c.order(ACCT), [0, 1]);
        // The next request goes to the good server at once.
        let t = Instant::now();
        assert!(authenticate(&c, &f, Some("pw")).is_ok());
        assert!(
            t.elapsed() < Duration::from_millis(250),
            "{:?}",
            t.elapsed()
        );
        // An answer puts a server back in its place.
        c.mark(0, AUTH, true);
        assert_eq!(c.order(AUTH), [0, 1]);
    }
}
