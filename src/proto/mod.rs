//! Wire code of the protocols the proxy speaks on both sides: the server
//! side a service uses and the client side the parent chain uses live
//! together, one codec per protocol (as g3's `g3-socks` serves both its
//! SOCKS server and its chaining client).
//!
//! - `socks`: SOCKS4/4a/5 messages, and the handshakes with a SOCKS parent.
//! - `http`: HTTP/1.x heads, framing and rewriting, and the CONNECT
//!   handshake with an HTTP parent.
//!
//! Invariant: parsing and encoding are pure; the only IO here is the
//! client handshakes, on a stream the caller connected, each read and
//! write failing with the given result code.

pub mod http;
pub mod radius;
pub mod socks;

use std::io::{Read, Write};

use crate::net::Stream;
use crate::res::Res;

/// Write all of `b`, or fail with `code`.
fn send(mut s: &Stream, b: &[u8], code: Res) -> Result<(), Res> {
    s.write_all(b).map_err(|_| code)
}

/// Fill `b`, or fail with `code`.
fn recv(mut s: &Stream, b: &mut [u8], code: Res) -> Result<(), Res> {
    s.read_exact(b).map_err(|_| code)
}
