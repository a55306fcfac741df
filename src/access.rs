//! Access control: the one call every service makes once it knows what a
//! client asks for (3proxy's auth.c `doauth`/`checkACL`, acl.c).
//!
//! STUB until the access-control issue lands: `authorize` grants
//! everything. Its signature is the contract services code against.

use std::net::{IpAddr, SocketAddr};

use crate::res::Res;
use crate::services::Service;

/// The operation a client asks for (the ACL's operation field).
#[allow(dead_code)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Connect,
    Bind,
    UdpAssoc,
    HttpGet,
    HttpPut,
    HttpPost,
    HttpHead,
    HttpConnect,
    HttpOther,
    FtpGet,
    FtpPut,
    FtpList,
    FtpData,
    Admin,
    DnsResolve,
}

/// What a client asks for, as far as the service knows it.
#[allow(dead_code)]
#[derive(Debug, Clone, Default)]
pub struct Request<'a> {
    pub op: Option<Op>,
    /// The client's address (after a PROXY header, if any).
    pub client: Option<SocketAddr>,
    /// The address the client connected to (the service side).
    pub local: Option<SocketAddr>,
    /// Destination host name, when the client gave a name.
    pub host: Option<&'a str>,
    /// Destination address, when known.
    pub addr: Option<IpAddr>,
    pub port: u16,
    /// Credentials, when the protocol carried them.
    pub user: Option<&'a str>,
    pub password: Option<&'a str>,
}

/// What an allowed request may use (parents, limits: filled in later).
#[derive(Debug, Clone, Default)]
pub struct Grant {}

/// Authenticate and authorize a request against the service's `auth` and
/// ACL snapshot. Err carries 3proxy's code: 1 denied, 3 no rule matched,
/// 4 no user name, 5 unknown user, 6-8 wrong password, 10 a limit.
pub fn authorize(_svc: &Service, _req: &Request<'_>) -> Result<Grant, Res> {
    Ok(Grant {})
}
