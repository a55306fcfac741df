//! Wire code of the protocols the proxy speaks on both sides: the server
//! side a service uses and the client side the parent chain uses live
//! together, one codec per protocol (as g3's `g3-socks` serves both its
//! SOCKS server and its chaining client).
//!
//! - `dns`: a DNS query's question and the answers dnspr builds from it;
//!   the resolver's query and the checks on its reply.
//! - `ftp`: FTP replies, PASV/EPSV/PORT, ftppr's login.
//! - `http`: HTTP/1.x heads, framing and rewriting, and the CONNECT
//!   handshake with an HTTP parent.
//! - `imap`: IMAP's LOGIN and AUTHENTICATE credentials.
//! - `mail`: the line dialogues' lines and `name@host[:port]` logins
//!   (pop3p, imapp, smtpp, ftppr, tlspr's STARTTLS).
//! - `proxy_v1`: the PROXY protocol v1 header, read (`-H`) and written
//!   (`ha`).
//! - `radius`: RADIUS packets, authenticators, password hiding.
//! - `smtp`: SMTP's AUTH credentials.
//! - `socks`: SOCKS4/4a/5 messages, the server's reader of a client's
//!   handshake, and the handshakes with a SOCKS parent.
//! - `tls`: TLS records, the ClientHello and ServerHello, a handshake
//!   flight.
//!
//! Invariant: parsing and encoding are pure; the only IO here is the
//! client handshakes, on a stream the caller connected, each read and
//! write failing with the given result code. Services read the bytes and
//! call these; nothing here imports a policy layer or a service.

pub mod dns;
pub mod ftp;
pub mod http;
pub mod imap;
pub mod mail;
pub mod proxy_v1;
pub mod radius;
pub mod smtp;
pub mod socks;
pub mod tls;

use std::io::{Read, Write};

use crate::net::Stream;
use crate::res::Res;

/// `line` begins with `word`, ASCII case aside (HTTP field values, mail
/// and FTP commands).
pub(crate) fn starts_ci(line: &[u8], word: &[u8]) -> bool {
    line.len() >= word.len() && line[..word.len()].eq_ignore_ascii_case(word)
}

/// Write all of `b`, or fail with `code`.
fn send(mut s: &Stream, b: &[u8], code: Res) -> Result<(), Res> {
    s.write_all(b).map_err(|_| code)
}

/// Fill `b`, or fail with `code`.
fn recv(mut s: &Stream, b: &mut [u8], code: Res) -> Result<(), Res> {
    s.read_exact(b).map_err(|_| code)
}
