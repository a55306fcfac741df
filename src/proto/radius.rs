//! RADIUS packets (RFC 2865 authentication, RFC 2866 accounting, RFC 3579
//! Message-Authenticator): building requests with the attributes 3proxy's
//! authradius.c sends, hiding the password, and checking and reading a
//! server's reply.
//!
//! Invariant: pure. Nothing here opens a socket; `crate::radius` sends what
//! this builds and hands back what it received.

use std::net::IpAddr;

use hmac::{Hmac, Mac};
use md5::{Digest, Md5};

/// Packet codes.
pub const ACCESS_REQUEST: u8 = 1;
pub const ACCESS_ACCEPT: u8 = 2;
pub const ACCESS_REJECT: u8 = 3;
pub const ACCOUNTING_REQUEST: u8 = 4;
pub const ACCOUNTING_RESPONSE: u8 = 5;
/// RFC 5176 (Dynamic Authorization): what a `radiusdae` listener takes
/// and answers.
pub const DISCONNECT_REQUEST: u8 = 40;
pub const DISCONNECT_ACK: u8 = 41;
pub const DISCONNECT_NAK: u8 = 42;
pub const COA_REQUEST: u8 = 43;
pub const COA_NAK: u8 = 45;

/// Attribute types (RFC 2865, 2866, 2869, 3162, 6911).
pub mod attr {
    pub const USER_NAME: u8 = 1;
    pub const USER_PASSWORD: u8 = 2;
    pub const NAS_IP_ADDRESS: u8 = 4;
    pub const NAS_PORT: u8 = 5;
    pub const SERVICE_TYPE: u8 = 6;
    pub const FRAMED_IP_ADDRESS: u8 = 8;
    pub const LOGIN_IP_HOST: u8 = 14;
    pub const LOGIN_SERVICE: u8 = 15;
    pub const LOGIN_TCP_PORT: u8 = 16;
    pub const REPLY_MESSAGE: u8 = 18;
    pub const CLASS: u8 = 25;
    pub const SESSION_TIMEOUT: u8 = 27;
    pub const CALLED_STATION_ID: u8 = 30;
    pub const CALLING_STATION_ID: u8 = 31;
    pub const NAS_IDENTIFIER: u8 = 32;
    pub const ACCT_STATUS_TYPE: u8 = 40;
    pub const ACCT_DELAY_TIME: u8 = 41;
    pub const ACCT_INPUT_OCTETS: u8 = 42;
    pub const ACCT_OUTPUT_OCTETS: u8 = 43;
    pub const ACCT_SESSION_ID: u8 = 44;
    pub const ACCT_SESSION_TIME: u8 = 46;
    pub const ACCT_TERMINATE_CAUSE: u8 = 49;
    pub const ACCT_INPUT_GIGAWORDS: u8 = 52;
    pub const ACCT_OUTPUT_GIGAWORDS: u8 = 53;
    pub const NAS_PORT_TYPE: u8 = 61;
    pub const MESSAGE_AUTHENTICATOR: u8 = 80;
    pub const NAS_IPV6_ADDRESS: u8 = 95;
    pub const LOGIN_IPV6_HOST: u8 = 98;
    pub const FRAMED_IPV6_ADDRESS: u8 = 168;
    pub const ERROR_CAUSE: u8 = 101;
}

/// Service-Type Authenticate-Only, what 3proxy asks for.
pub const SERVICE_AUTHENTICATE_ONLY: u32 = 8;
/// NAS-Port-Type Virtual.
pub const PORT_VIRTUAL: u32 = 5;

/// Acct-Status-Type values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Start = 1,
    Stop = 2,
    InterimUpdate = 3,
}

/// The largest packet RFC 2865 allows.
pub const MAX_PACKET: usize = 4096;
const HEADER: usize = 20;

/// A request being built: header, then attributes in the order added.
#[derive(Debug, Clone)]
pub struct Builder {
    buf: Vec<u8>,
}

impl Builder {
    /// A request with this code, identifier and Request Authenticator (for
    /// an Accounting-Request, [`Builder::finish_accounting`] computes it and
    /// the one given is ignored).
    pub fn new(code: u8, id: u8, authenticator: [u8; 16]) -> Builder {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&[code, id, 0, 0]);
        buf.extend_from_slice(&authenticator);
        Builder { buf }
    }

    /// [`Builder::new`] in a buffer kept from an earlier request (its
    /// bytes are dropped, its capacity kept).
    pub fn reuse(mut buf: Vec<u8>, code: u8, id: u8, authenticator: [u8; 16]) -> Builder {
        buf.clear();
        buf.extend_from_slice(&[code, id, 0, 0]);
        buf.extend_from_slice(&authenticator);
        Builder { buf }
    }

    /// The request as built so far, header unfinished: an accounting
    /// request that [`seal_accounting`] finishes later (on another
    /// thread, once its identifier is known).
    pub fn into_unsealed(self) -> Vec<u8> {
        self.buf
    }

    /// Go on building an unsealed request.
    pub fn resume(buf: Vec<u8>) -> Builder {
        Builder { buf }
    }

    /// Add an attribute; a value longer than 253 bytes is cut there, and
    /// one that would make the packet larger than 4096 bytes is left out.
    pub fn add(&mut self, t: u8, value: &[u8]) -> &mut Builder {
        let v = &value[..value.len().min(253)];
        if self.buf.len() + 2 + v.len() <= MAX_PACKET - 18 {
            self.buf.push(t);
            self.buf.push(2 + v.len() as u8);
            self.buf.extend_from_slice(v);
        }
        self
    }

    pub fn add_u32(&mut self, t: u8, v: u32) -> &mut Builder {
        self.add(t, &v.to_be_bytes())
    }

    /// An address attribute: `v4` for an IPv4 address, `v6` for an IPv6
    /// one (an IPv4-mapped address counts as IPv4).
    pub fn add_ip(&mut self, v4: u8, v6: u8, a: IpAddr) -> &mut Builder {
        match a.to_canonical() {
            IpAddr::V4(a) => self.add(v4, &a.octets()),
            IpAddr::V6(a) => self.add(v6, &a.octets()),
        }
    }

    /// User-Password, hidden with the secret and this packet's Request
    /// Authenticator (RFC 2865 5.2); at most 128 bytes, as 3proxy sends.
    pub fn add_password(&mut self, password: &[u8], secret: &[u8]) -> &mut Builder {
        let mut auth = [0u8; 16];
        auth.copy_from_slice(&self.buf[4..20]);
        let hidden = hide_password(password, secret, &auth);
        self.add(attr::USER_PASSWORD, &hidden)
    }

    fn set_length(&mut self) {
        let len = self.buf.len() as u16;
        self.buf[2..4].copy_from_slice(&len.to_be_bytes());
    }

    /// An Access-Request's bytes, ending in a Message-Authenticator
    /// (HMAC-MD5 of the whole packet under the secret, RFC 3579 3.2).
    pub fn finish_access(mut self, secret: &[u8]) -> Vec<u8> {
        self.buf.push(attr::MESSAGE_AUTHENTICATOR);
        self.buf.push(18);
        let at = self.buf.len();
        self.buf.extend_from_slice(&[0; 16]);
        self.set_length();
        let mac = hmac_md5(secret, &self.buf);
        self.buf[at..at + 16].copy_from_slice(&mac);
        self.buf
    }

    /// An answer's bytes (built with the request's identifier and Request
    /// Authenticator): its Response Authenticator is the MD5 of the packet
    /// as built and the secret (RFC 2865 3, RFC 5176 2.3).
    pub fn finish_response(mut self, secret: &[u8]) -> Vec<u8> {
        self.set_length();
        let mut h = Md5::new();
        h.update(&self.buf);
        h.update(secret);
        let d = h.finalize();
        self.buf[4..20].copy_from_slice(&d);
        self.buf
    }

    /// An Accounting-Request's bytes: its Request Authenticator is the MD5
    /// of the packet (with 16 zero bytes in its place) and the secret
    /// (RFC 2866 3). The proxy seals its own with [`seal_accounting`];
    /// the tests build whole packets with this.
    #[cfg(test)]
    pub fn finish_accounting(mut self, secret: &[u8]) -> Vec<u8> {
        self.set_length();
        self.buf[4..20].fill(0);
        let mut h = Md5::new();
        h.update(&self.buf);
        h.update(secret);
        let d = h.finalize();
        self.buf[4..20].copy_from_slice(&d);
        self.buf
    }
}

/// Finish an Accounting-Request built by [`Builder::into_unsealed`] in
/// place: identifier `id`, its length, and its Request Authenticator
/// (as [`Builder::finish_accounting`]).
pub fn seal_accounting(buf: &mut [u8], id: u8, secret: &[u8]) {
    if buf.len() < HEADER {
        return;
    }
    buf[1] = id;
    let len = buf.len() as u16;
    buf[2..4].copy_from_slice(&len.to_be_bytes());
    buf[4..20].fill(0);
    let mut h = Md5::new();
    h.update(&*buf);
    h.update(secret);
    let d = h.finalize();
    buf[4..20].copy_from_slice(&d);
}

fn hmac_md5(key: &[u8], data: &[u8]) -> [u8; 16] {
    // HMAC takes a key of any length.
    let mut m = <Hmac<Md5> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(data);
    m.finalize().into_bytes().into()
}

/// RFC 2865 5.2: the password padded with zeros to a multiple of 16 (at
/// most 128 bytes), each 16-byte block XORed with MD5(secret + the
/// previous hidden block), the first with MD5(secret + authenticator).
pub fn hide_password(password: &[u8], secret: &[u8], authenticator: &[u8; 16]) -> Vec<u8> {
    let p = &password[..password.len().min(128)];
    let len = p.len().div_ceil(16).max(1) * 16;
    let mut out = vec![0u8; len];
    out[..p.len()].copy_from_slice(p);
    let mut prev: [u8; 16] = *authenticator;
    for block in out.chunks_mut(16) {
        let mut h = Md5::new();
        h.update(secret);
        h.update(prev);
        let d = h.finalize();
        for (b, k) in block.iter_mut().zip(d.iter()) {
            *b ^= k;
        }
        prev.copy_from_slice(block);
    }
    out
}

/// The reverse of [`hide_password`], zero padding removed (what a server
/// does; the tests use it).
#[cfg(test)]
pub fn unhide_password(hidden: &[u8], secret: &[u8], authenticator: &[u8; 16]) -> Vec<u8> {
    let mut out = hidden.to_vec();
    let mut prev: [u8; 16] = *authenticator;
    for block in out.chunks_mut(16) {
        let mut h = Md5::new();
        h.update(secret);
        h.update(prev);
        let d = h.finalize();
        prev.copy_from_slice(block);
        for (b, k) in block.iter_mut().zip(d.iter()) {
            *b ^= k;
        }
    }
    while out.last() == Some(&0) {
        out.pop();
    }
    out
}

/// What the proxy reads from an Access-Accept or Access-Reject.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reply {
    pub code: u8,
    /// Framed-IP-Address / Framed-IPv6-Address: the user's outgoing
    /// address.
    pub framed_ip: Option<IpAddr>,
    /// Session-Timeout, seconds.
    pub session_timeout: Option<u32>,
    /// Class attributes, to be echoed in accounting (RFC 2865 5.25).
    pub class: Vec<Vec<u8>>,
    /// A Reply-Message that starts with digits: 3proxy takes them for the
    /// result code of a reject.
    pub reply_code: Option<u32>,
}

/// Why a datagram is not a valid answer to our request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Shorter than a header, or its length field disagrees.
    Length,
    /// Another identifier: an answer to another request.
    Id,
    /// A code that does not answer our request's.
    Code,
    /// The Response Authenticator does not check out: wrong secret or
    /// forged.
    Authenticator,
    /// A Message-Authenticator that does not check out.
    MessageAuthenticator,
    /// The attributes do not add up to the packet.
    Attributes,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fault::Length => "bad length",
            Fault::Id => "another request's identifier",
            Fault::Code => "unexpected packet code",
            Fault::Authenticator => "bad Response Authenticator (wrong secret?)",
            Fault::MessageAuthenticator => "bad Message-Authenticator",
            Fault::Attributes => "malformed attributes",
        })
    }
}

/// Check `pkt` as the answer to the request `req` (its bytes as sent):
/// same identifier, a code that answers it, the Response Authenticator
/// MD5(code, id, length, request authenticator, attributes, secret) and a
/// Message-Authenticator if there is one; then read the attributes 3proxy
/// reads, and Session-Timeout and Class.
pub fn parse_reply(pkt: &[u8], req: &[u8], secret: &[u8]) -> Result<Reply, Fault> {
    if pkt.len() < HEADER || req.len() < HEADER {
        return Err(Fault::Length);
    }
    let len = u16::from_be_bytes([pkt[2], pkt[3]]) as usize;
    if len < HEADER || len > pkt.len() || len > MAX_PACKET {
        return Err(Fault::Length);
    }
    // Octets past the length field are padding (RFC 2865 3).
    let pkt = &pkt[..len];
    if pkt[1] != req[1] {
        return Err(Fault::Id);
    }
    let answers = match req[0] {
        ACCESS_REQUEST => pkt[0] == ACCESS_ACCEPT || pkt[0] == ACCESS_REJECT,
        ACCOUNTING_REQUEST => pkt[0] == ACCOUNTING_RESPONSE,
        _ => false,
    };
    if !answers {
        return Err(Fault::Code);
    }
    let req_auth = &req[4..20];
    let mut h = Md5::new();
    h.update(&pkt[..4]);
    h.update(req_auth);
    h.update(&pkt[20..]);
    h.update(secret);
    if !ct_eq(&h.finalize(), &pkt[4..20]) {
        return Err(Fault::Authenticator);
    }
    let mut r = Reply {
        code: pkt[0],
        ..Reply::default()
    };
    let mut at = HEADER;
    while at < len {
        if len - at < 2 {
            return Err(Fault::Attributes);
        }
        let (t, l) = (pkt[at], pkt[at + 1] as usize);
        if l < 2 || at + l > len {
            return Err(Fault::Attributes);
        }
        let v = &pkt[at + 2..at + l];
        match (t, v.len()) {
            (attr::FRAMED_IP_ADDRESS, 4) => {
                r.framed_ip = Some(IpAddr::from(<[u8; 4]>::try_from(v).unwrap_or_default()));
            }
            (attr::FRAMED_IPV6_ADDRESS, 16) => {
                r.framed_ip = Some(IpAddr::from(<[u8; 16]>::try_from(v).unwrap_or_default()));
            }
            (attr::SESSION_TIMEOUT, 4) => {
                r.session_timeout = Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]]));
            }
            (attr::CLASS, _) => r.class.push(v.to_vec()),
            (attr::REPLY_MESSAGE, _) if v.first().is_some_and(u8::is_ascii_digit) => {
                let digits = v.iter().take_while(|b| b.is_ascii_digit());
                r.reply_code = Some(digits.fold(0u32, |n, d| {
                    n.saturating_mul(10).saturating_add(u32::from(d - b'0'))
                }));
            }
            (attr::MESSAGE_AUTHENTICATOR, 16) => {
                // HMAC-MD5 over the reply with the request's
                // authenticator in place and this attribute zeroed.
                let mut copy = pkt.to_vec();
                copy[4..20].copy_from_slice(req_auth);
                copy[at + 2..at + l].fill(0);
                if !ct_eq(&hmac_md5(secret, &copy), v) {
                    return Err(Fault::MessageAuthenticator);
                }
            }
            (attr::MESSAGE_AUTHENTICATOR, _) => return Err(Fault::MessageAuthenticator),
            _ => {}
        }
        at += l;
    }
    Ok(r)
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Acct-Terminate-Cause values (RFC 2866 5.10) this proxy reports.
pub mod cause {
    pub const USER_REQUEST: u32 = 1;
    pub const LOST_CARRIER: u32 = 2;
    pub const LOST_SERVICE: u32 = 3;
    pub const IDLE_TIMEOUT: u32 = 4;
    pub const SESSION_TIMEOUT: u32 = 5;
    pub const ADMIN_RESET: u32 = 6;
    pub const NAS_ERROR: u32 = 9;
    pub const NAS_REQUEST: u32 = 10;
    pub const PORT_PREEMPTED: u32 = 13;
    pub const SERVICE_UNAVAILABLE: u32 = 15;
    pub const USER_ERROR: u32 = 17;
}

/// Error-Cause values (RFC 5176 3.6) a Disconnect-NAK or CoA-NAK carries.
pub mod error_cause {
    pub const MISSING_ATTRIBUTE: u32 = 402;
    pub const UNSUPPORTED_EXTENSION: u32 = 406;
    pub const SESSION_CONTEXT_NOT_FOUND: u32 = 503;
}

/// A Disconnect-Request or CoA-Request (RFC 5176) whose authenticators
/// checked out: the session identification it names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaeRequest {
    pub code: u8,
    pub id: u8,
    pub authenticator: [u8; 16],
    pub user: Option<String>,
    pub session_id: Option<String>,
}

/// Check a Disconnect-Request or CoA-Request: its code, its length, its
/// Request Authenticator (MD5 of the packet with 16 zero bytes in its
/// place, and the secret, as for an Accounting-Request) and its
/// Message-Authenticator if it has one (HMAC-MD5 with the authenticator
/// field zeroed, as FreeRADIUS computes it); then read User-Name and
/// Acct-Session-Id. Other attributes are not looked at.
pub fn parse_dae(pkt: &[u8], secret: &[u8]) -> Result<DaeRequest, Fault> {
    if pkt.len() < HEADER {
        return Err(Fault::Length);
    }
    let len = u16::from_be_bytes([pkt[2], pkt[3]]) as usize;
    if len < HEADER || len > pkt.len() || len > MAX_PACKET {
        return Err(Fault::Length);
    }
    let pkt = &pkt[..len];
    if pkt[0] != DISCONNECT_REQUEST && pkt[0] != COA_REQUEST {
        return Err(Fault::Code);
    }
    let mut h = Md5::new();
    h.update(&pkt[..4]);
    h.update([0u8; 16]);
    h.update(&pkt[20..]);
    h.update(secret);
    if !ct_eq(&h.finalize(), &pkt[4..20]) {
        return Err(Fault::Authenticator);
    }
    let mut r = DaeRequest {
        code: pkt[0],
        id: pkt[1],
        ..DaeRequest::default()
    };
    r.authenticator.copy_from_slice(&pkt[4..20]);
    let mut at = HEADER;
    while at < len {
        if len - at < 2 {
            return Err(Fault::Attributes);
        }
        let (t, l) = (pkt[at], pkt[at + 1] as usize);
        if l < 2 || at + l > len {
            return Err(Fault::Attributes);
        }
        let v = &pkt[at + 2..at + l];
        match t {
            attr::USER_NAME => r.user = Some(String::from_utf8_lossy(v).into_owned()),
            attr::ACCT_SESSION_ID => {
                r.session_id = Some(String::from_utf8_lossy(v).into_owned());
            }
            attr::MESSAGE_AUTHENTICATOR => {
                let mut copy = pkt.to_vec();
                copy[4..20].fill(0);
                copy[at + 2..at + l].fill(0);
                if v.len() != 16 || !ct_eq(&hmac_md5(secret, &copy), v) {
                    return Err(Fault::MessageAuthenticator);
                }
            }
            _ => {}
        }
        at += l;
    }
    Ok(r)
}

/// A session's byte counters in accounting attributes: the low 32 bits
/// as Acct-*-Octets, the rest as Acct-*-Gigawords when there is any
/// (RFC 2869 5.1, 5.2). `input` is Acct-Input.
pub fn add_octets(b: &mut Builder, input: u64, output: u64) {
    b.add_u32(attr::ACCT_INPUT_OCTETS, input as u32);
    if input >> 32 != 0 {
        b.add_u32(attr::ACCT_INPUT_GIGAWORDS, (input >> 32) as u32);
    }
    b.add_u32(attr::ACCT_OUTPUT_OCTETS, output as u32);
    if output >> 32 != 0 {
        b.add_u32(attr::ACCT_OUTPUT_GIGAWORDS, (output >> 32) as u32);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn sealing_later_is_finishing_at_once() {
        let mut b = Builder::new(ACCOUNTING_REQUEST, 7, [0; 16]);
        b.add(attr::USER_NAME, b"alice");
        let whole = b.clone().finish_accounting(b"s");
        let mut b = Builder::reuse(vec![9; 300], ACCOUNTING_REQUEST, 0, [1; 16]);
        b.add(attr::USER_NAME, b"alice");
        let mut late = b.into_unsealed();
        seal_accounting(&mut late, 7, b"s");
        assert_eq!(late, whole);
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    // RFC 2865 7.1: user "nemo", password "arctangent", secret
    // "xyzzy5461".
    const RFC_REQUEST: &str = "01 00 00 38 0f 40 3f 94 73 97 80 57 bd 83 d5 cb
        98 f4 22 7a 01 06 6e 65 6d 6f 02 12 0d be 70 8d 93 d4 13 ce 31 96 e4 3f
        78 2a 0a ee 04 06 c0 a8 01 10 05 06 00 00 00 03";
    const RFC_ACCEPT: &str = "02 00 00 26 86 fe 22 0e 76 24 ba 2a 10 05 f6 bf
        9b 55 e0 b2 06 06 00 00 00 01 0f 06 00 00 00 00 0e 06 c0 a8 01 03";

    fn rfc_auth() -> [u8; 16] {
        hex(RFC_REQUEST)[4..20].try_into().unwrap()
    }

    #[test]
    fn disconnect_requests_are_checked() {
        // A Disconnect-Request's authenticator is computed as an
        // Accounting-Request's.
        let mut b = Builder::new(DISCONNECT_REQUEST, 9, [0; 16]);
        b.add(attr::USER_NAME, b"alice");
        b.add(attr::ACCT_SESSION_ID, b"1.2.3");
        let pkt = b.finish_accounting(b"s");
        let r = parse_dae(&pkt, b"s").unwrap();
        assert_eq!((r.code, r.id), (DISCONNECT_REQUEST, 9));
        assert_eq!(r.user.as_deref(), Some("alice"));
        assert_eq!(r.session_id.as_deref(), Some("1.2.3"));
        assert_eq!(parse_dae(&pkt, b"other"), Err(Fault::Authenticator));
        let mut bad = pkt.clone();
        bad[25] ^= 1;
        assert_eq!(parse_dae(&bad, b"s"), Err(Fault::Authenticator));
        assert_eq!(parse_dae(&pkt[..10], b"s"), Err(Fault::Length));
        let acct = Builder::new(ACCOUNTING_REQUEST, 1, [0; 16]).finish_accounting(b"s");
        assert_eq!(parse_dae(&acct, b"s"), Err(Fault::Code));
        // A Message-Authenticator is checked: HMAC-MD5 with the
        // authenticator and itself zeroed, then the authenticator.
        let mut b = Builder::new(COA_REQUEST, 3, [0; 16]);
        b.add(attr::USER_NAME, b"bob");
        b.add(attr::MESSAGE_AUTHENTICATOR, &[0; 16]);
        let mut pkt = b.finish_accounting(b"s");
        let at = pkt.len() - 16;
        pkt[4..20].fill(0);
        let mac = hmac_md5(b"s", &pkt);
        pkt[at..].copy_from_slice(&mac);
        let mut h = Md5::new();
        h.update(&pkt);
        h.update(b"s");
        let d = h.finalize();
        pkt[4..20].copy_from_slice(&d);
        assert_eq!(parse_dae(&pkt, b"s").unwrap().user.as_deref(), Some("bob"));
        pkt[at] ^= 1;
        // (the Request Authenticator covers it too: recompute it)
        pkt[4..20].fill(0);
        let mut h = Md5::new();
        h.update(&pkt);
        h.update(b"s");
        let d = h.finalize();
        pkt[4..20].copy_from_slice(&d);
        assert_eq!(parse_dae(&pkt, b"s"), Err(Fault::MessageAuthenticator));
        // The answer's Response Authenticator covers the request's.
        let ans = Builder::new(DISCONNECT_ACK, 9, r.authenticator).finish_response(b"s");
        let mut h = Md5::new();
        h.update(&ans[..4]);
        h.update(r.authenticator);
        h.update(&ans[20..]);
        h.update(b"s");
        assert_eq!(&ans[4..20], &h.finalize()[..]);
    }

    #[test]
    fn password_hiding_matches_rfc_2865() {
        let hidden = hide_password(b"arctangent", b"xyzzy5461", &rfc_auth());
        assert_eq!(hidden, hex(RFC_REQUEST)[28..44]);
        assert_eq!(
            unhide_password(&hidden, b"xyzzy5461", &rfc_auth()),
            b"arctangent"
        );
    }

    #[test]
    fn the_rfc_request_is_built_byte_for_byte() {
        let mut b = Builder::new(ACCESS_REQUEST, 0, rfc_auth());
        b.add(attr::USER_NAME, b"nemo")
            .add_password(b"arctangent", b"xyzzy5461")
            .add(attr::NAS_IP_ADDRESS, &[192, 168, 1, 16])
            .add_u32(attr::NAS_PORT, 3);
        b.set_length();
        assert_eq!(b.buf, hex(RFC_REQUEST));
    }

    #[test]
    fn long_passwords_chain_blocks() {
        let auth = [7u8; 16];
        for n in [0usize, 1, 15, 16, 17, 33, 128, 200] {
            let p: Vec<u8> = (1..=n).map(|i| i as u8).collect();
            let h = hide_password(&p, b"s3cret", &auth);
            let want = n.min(128).div_ceil(16).max(1) * 16;
            assert_eq!(h.len(), want, "{n}");
            assert_eq!(unhide_password(&h, b"s3cret", &auth), &p[..n.min(128)]);
        }
    }

    #[test]
    fn the_rfc_accept_checks_out() {
        let r = parse_reply(&hex(RFC_ACCEPT), &hex(RFC_REQUEST), b"xyzzy5461").unwrap();
        assert_eq!(r.code, ACCESS_ACCEPT);
        assert_eq!(r.framed_ip, None);
        // A wrong secret or a changed byte is refused.
        assert_eq!(
            parse_reply(&hex(RFC_ACCEPT), &hex(RFC_REQUEST), b"xyzzy546"),
            Err(Fault::Authenticator)
        );
        let mut bad = hex(RFC_ACCEPT);
        bad[37] ^= 1;
        assert_eq!(
            parse_reply(&bad, &hex(RFC_REQUEST), b"xyzzy5461"),
            Err(Fault::Authenticator)
        );
        let mut other = hex(RFC_REQUEST);
        other[1] = 9;
        assert_eq!(
            parse_reply(&hex(RFC_ACCEPT), &other, b"xyzzy5461"),
            Err(Fault::Id)
        );
    }

    /// A server's reply to `req`: attributes, then the Response
    /// Authenticator, with a Message-Authenticator when `ma`.
    pub(crate) fn reply(
        code: u8,
        req: &[u8],
        attrs: &[(u8, &[u8])],
        secret: &[u8],
        ma: bool,
    ) -> Vec<u8> {
        let mut b = Builder::new(code, req[1], req[4..20].try_into().unwrap());
        for (t, v) in attrs {
            b.add(*t, v);
        }
        let mut p = if ma {
            // The request authenticator is in place while the HMAC is made.
            b.finish_access(secret)
        } else {
            b.set_length();
            b.buf
        };
        let mut h = Md5::new();
        h.update(&p[..4]);
        h.update(&req[4..20]);
        h.update(&p[20..]);
        h.update(secret);
        let d = h.finalize();
        p[4..20].copy_from_slice(&d);
        p
    }

    #[test]
    fn reply_attributes_are_read() {
        let secret = b"testing123";
        let mut b = Builder::new(ACCESS_REQUEST, 42, [3; 16]);
        b.add(attr::USER_NAME, b"u");
        let req = b.finish_access(secret);
        assert_eq!(req.len(), 20 + 3 + 18);
        let p = reply(
            ACCESS_ACCEPT,
            &req,
            &[
                (attr::FRAMED_IP_ADDRESS, &[127, 0, 0, 2]),
                (attr::SESSION_TIMEOUT, &[0, 0, 1, 0]),
                (attr::CLASS, b"gold"),
                (attr::CLASS, b"x"),
                (26, &[0, 0, 0, 9, 1, 3, 0]), // a Vendor-Specific, skipped
            ],
            secret,
            true,
        );
        let r = parse_reply(&p, &req, secret).unwrap();
        assert_eq!(r.framed_ip, Some("127.0.0.2".parse().unwrap()));
        assert_eq!(r.session_timeout, Some(256));
        assert_eq!(r.class, vec![b"gold".to_vec(), b"x".to_vec()]);
        // A Message-Authenticator that does not check out is refused.
        let mut bad = p.clone();
        let n = bad.len();
        bad[n - 1] ^= 1;
        // Fix the Response Authenticator so only the HMAC is wrong.
        let mut h = Md5::new();
        h.update(&bad[..4]);
        h.update(&req[4..20]);
        h.update(&bad[20..]);
        h.update(secret);
        let d = h.finalize();
        bad[4..20].copy_from_slice(&d);
        assert_eq!(
            parse_reply(&bad, &req, secret),
            Err(Fault::MessageAuthenticator)
        );

        let p = reply(
            ACCESS_REJECT,
            &req,
            &[(attr::REPLY_MESSAGE, b"30 go away")],
            secret,
            false,
        );
        let r = parse_reply(&p, &req, secret).unwrap();
        assert_eq!((r.code, r.reply_code), (ACCESS_REJECT, Some(30)));
        // An accounting response does not answer an Access-Request.
        let p = reply(ACCOUNTING_RESPONSE, &req, &[], secret, false);
        assert_eq!(parse_reply(&p, &req, secret), Err(Fault::Code));
        // Truncated attributes.
        let mut p = reply(ACCESS_ACCEPT, &req, &[(attr::CLASS, b"abc")], secret, false);
        p[21] = 9;
        assert_eq!(parse_reply(&p, &req, secret), Err(Fault::Authenticator));
        assert_eq!(parse_reply(&p[..10], &req, secret), Err(Fault::Length));
    }

    #[test]
    fn message_authenticator_is_hmac_md5_of_the_packet() {
        let secret = b"k";
        let mut b = Builder::new(ACCESS_REQUEST, 1, [9; 16]);
        b.add(attr::USER_NAME, b"bob");
        let p = b.finish_access(secret);
        let n = p.len();
        let mut zeroed = p.clone();
        zeroed[n - 16..].fill(0);
        assert_eq!(&p[n - 18..n - 16], &[80, 18]);
        assert_eq!(&p[n - 16..], &hmac_md5(secret, &zeroed));
        assert_eq!(u16::from_be_bytes([p[2], p[3]]) as usize, n);
    }

    #[test]
    fn accounting_authenticator_and_octets() {
        let secret = b"acct";
        let mut b = Builder::new(ACCOUNTING_REQUEST, 5, [0xff; 16]);
        b.add_u32(attr::ACCT_STATUS_TYPE, Status::Stop as u32);
        add_octets(&mut b, 5 << 32 | 7, 9);
        let p = b.finish_accounting(secret);
        // 40, then input octets and gigawords, then output octets only.
        assert_eq!(&p[26..32], &[42, 6, 0, 0, 0, 7]);
        assert_eq!(&p[32..38], &[52, 6, 0, 0, 0, 5]);
        assert_eq!(&p[38..44], &[43, 6, 0, 0, 0, 9]);
        assert_eq!(p.len(), 44);
        let mut z = p.clone();
        z[4..20].fill(0);
        let mut h = Md5::new();
        h.update(&z);
        h.update(secret);
        assert_eq!(&p[4..20], &h.finalize()[..]);
    }

    #[test]
    fn long_values_are_cut() {
        let mut b = Builder::new(ACCESS_REQUEST, 1, [0; 16]);
        b.add(attr::USER_NAME, &[b'a'; 300]);
        assert_eq!(b.buf.len(), 20 + 255);
        assert_eq!(b.buf[21], 255);
        b.add_ip(
            attr::NAS_IP_ADDRESS,
            attr::NAS_IPV6_ADDRESS,
            "::ffff:10.0.0.1".parse().unwrap(),
        );
        assert_eq!(&b.buf[275..], &[4, 6, 10, 0, 0, 1]);
    }
}
