//! PROXY protocol version 1 (`-H`): a load balancer in front of us sends
//! `PROXY TCP4 <src> <dst> <sport> <dport>\r\n` before the client's bytes,
//! so the real client address survives (HAProxy's proxy-protocol.txt).
//!
//! The header itself is `proto::proxy_v1` (pure); `read` takes exactly
//! the header line off the socket (peeking first, so not one byte of the
//! client's data is consumed).

use std::io::Read;

use crate::net::Stream;
use crate::proto::proxy_v1::{parse, Header, MAX_LINE};

/// Read the header line from `s` (whose read timeout is already set) and
/// parse it. Consumes the line and nothing after it.
pub fn read(s: &Stream) -> Result<Header, String> {
    let mut line = Vec::with_capacity(MAX_LINE);
    let mut buf = [0u8; MAX_LINE];
    loop {
        let room = MAX_LINE - line.len();
        if room == 0 {
            return Err("header longer than 107 bytes".into());
        }
        let n = s.peek(&mut buf[..room]).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed before the header ended".into());
        }
        let take = buf[..n]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(n, |i| i + 1);
        let mut r = s;
        r.read_exact(&mut buf[..take]).map_err(|e| e.to_string())?;
        line.extend_from_slice(&buf[..take]);
        if line.last() == Some(&b'\n') {
            return parse(&line);
        }
    }
}
