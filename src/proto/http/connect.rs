//! The client side: an HTTP CONNECT parent.

use super::fields::basic_auth;
use crate::net::Stream;
use crate::proto::send;
use crate::proto::socks::Dest;
use crate::res::Res;
use std::io::Read;

/// `CONNECT host:port HTTP/1.0`; any 2xx status is success.
pub fn client_connect(
    s: &Stream,
    dest: &Dest,
    creds: Option<&(String, String)>,
) -> Result<(), Res> {
    let target = match dest {
        Dest::Name(n, p) if n.contains(':') => format!("[{n}]:{p}"),
        Dest::Name(n, p) => format!("{n}:{p}"),
        Dest::Addr(a) => a.to_string(),
    };
    let mut req = format!("CONNECT {target} HTTP/1.0\r\nConnection: keep-alive\r\n");
    if let Some((u, p)) = creds {
        req.push_str(&format!(
            "Proxy-Authorization: Basic {}\r\n",
            basic_auth(u, p)
        ));
    }
    req.push_str("\r\n");
    send(s, req.as_bytes(), Res::PARENT_CONNECT_SEND)?;
    // Byte by byte: what follows the header belongs to the tunnel.
    let status = read_line(s, Res::PARENT_CONNECT_REPLY)?;
    if status.len() < 12 || !status.starts_with(b"HTTP/") {
        return Err(Res::PARENT_CONNECT_REPLY);
    }
    if status[9] != b'2' {
        return Err(Res::PARENT_CONNECT_REFUSED);
    }
    let mut total = status.len();
    loop {
        let line = read_line(s, Res::PARENT_CONNECT_HEAD)?;
        total += line.len();
        if line.is_empty() {
            return Ok(());
        }
        if total > MAX_REPLY_HEAD {
            return Err(Res::PARENT_CONNECT_HEAD);
        }
    }
}

/// The most a CONNECT parent may send before its blank line.
const MAX_REPLY_HEAD: usize = 16 * 1024;

/// One line without its CR LF; `code` on EOF, error or a line too long.
fn read_line(mut s: &Stream, code: Res) -> Result<Vec<u8>, Res> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b) {
            Ok(1) if b[0] == b'\n' => {
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(line);
            }
            Ok(1) if line.len() < MAX_REPLY_HEAD => line.push(b[0]),
            _ => return Err(code),
        }
    }
}
