//! The forwarding fields every forwarded request of a client gets
//! (`Forwarded`, or `Via` and `X-Forwarded-For`; 3proxy's `anonymous`).

use std::net::SocketAddr;
use std::sync::OnceLock;

use crate::client::Client;
use crate::service::Service;

/// The fields every forwarded request of this client gets: by default
/// `Forwarded`, with `-a1`/`-a2` `Via` and `X-Forwarded-For`, with `-a`
/// none (3proxy's `anonymous`).
pub(super) fn forwarding_fields(svc: &Service, c: &Client) -> Vec<u8> {
    use std::io::Write as _;
    let host = hostname();
    let port = svc.port();
    // One allocation per client: written in place, no intermediate strings.
    let mut v = Vec::with_capacity(64 + host.len());
    let _ = match (svc.opts.anonymous, c.client_addr) {
        (Some(0), _) => Ok(()),
        (Some(2), Some(a)) => write!(
            v,
            "Via: 1.1 {host}:{port} (3proxy)\r\nX-Forwarded-For: {}\r\n",
            a.ip()
        ),
        // Made up once per connection: a parked client keeps these
        // (`remade_alike` names the arms that cannot be made again).
        (Some(_), _) => write!(
            v,
            "Via: 1.1 {host}:{port} (3proxy)\r\nX-Forwarded-For: {}\r\n",
            random_ipv4(c)
        ),
        (None, Some(SocketAddr::V4(a))) => {
            put_forwarded_v4(&mut v, a, host, port);
            Ok(())
        }
        (None, Some(SocketAddr::V6(a))) => write!(
            v,
            "Forwarded: for=\"[{}]:{}\";by=\"{host}:{port}\"\r\n",
            a.ip(),
            a.port()
        ),
        (None, None) => write!(v, "Forwarded: by=\"{host}:{port}\"\r\n"),
    };
    v
}

/// [`forwarding_fields`] gives the same fields again for `c`: all but a
/// made-up address (`-a1`, or `-a2` without a client address), which is
/// the connection's own.
pub(super) fn remade_alike(svc: &Service, c: &Client) -> bool {
    match svc.opts.anonymous {
        None | Some(0) => true,
        Some(2) => c.client_addr.is_some(),
        Some(_) => false,
    }
}

/// `Forwarded: for="A:P";by="HOST:PORT"` for an IPv4 client, written by
/// hand: `write!` costs ~1,900 instructions here, for every new client.
fn put_forwarded_v4(v: &mut Vec<u8>, a: std::net::SocketAddrV4, host: &str, port: u16) {
    v.extend_from_slice(b"Forwarded: for=\"");
    for (i, o) in a.ip().octets().iter().enumerate() {
        if i > 0 {
            v.push(b'.');
        }
        put_decimal(v, u16::from(*o));
    }
    v.push(b':');
    put_decimal(v, a.port());
    v.extend_from_slice(b"\";by=\"");
    v.extend_from_slice(host.as_bytes());
    v.push(b':');
    put_decimal(v, port);
    v.extend_from_slice(b"\"\r\n");
}

/// `n` in decimal.
fn put_decimal(v: &mut Vec<u8>, n: u16) {
    let mut digits = [0u8; 20];
    v.extend_from_slice(crate::addr::decimal(u64::from(n), &mut digits));
}

fn hostname() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .filter(|h| {
                h.bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
            })
            .unwrap_or_else(|| "localhost".into())
    })
}

/// `-a1`: a made-up client address, different per connection.
fn random_ipv4(c: &Client) -> std::net::Ipv4Addr {
    let t = c
        .record
        .start
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let p = c.client_addr.map_or(7, |a| u64::from(a.port()));
    let mut x = t ^ (p << 32) ^ 0x9E37_79B9_7F4A_7C15;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    let b = (x as u32).to_be_bytes();
    // Keep clear of 0.x and 127.x.
    std::net::Ipv4Addr::new(b[0].clamp(1, 126), b[1], b[2], b[3].max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_v4_is_what_write_gave() {
        use std::io::Write as _;
        for (ip, p, port) in [
            ([127, 0, 0, 1], 80u16, 3128u16),
            ([0, 0, 0, 0], 1, 1),
            ([255, 255, 255, 255], 65535, 65535),
            ([10, 20, 100, 9], 40000, 8080),
        ] {
            let a = std::net::SocketAddrV4::new(ip.into(), p);
            let mut want = Vec::new();
            write!(want, "Forwarded: for=\"{a}\";by=\"box.lan:{port}\"\r\n").unwrap();
            let mut got = Vec::new();
            put_forwarded_v4(&mut got, a, "box.lan", port);
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(want).unwrap()
            );
        }
    }
}
