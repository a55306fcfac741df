//! Error answers (the page for a status, and the linger after it) and
//! the result codes of IO errors on the client's and the server's side.

use std::io::{self, Read};
use std::net::Shutdown;
use std::time::Duration;

use crate::net::Stream;
use crate::res::Res;

use super::body::is_quota;
use super::sock::{set_read_timeout, write_all_v};

/// Write an error answer (for the failure `res`); the byte count sent.
pub(super) fn send_error(cli: &Stream, status: u16, res: Res) -> usize {
    let (reason, why) = match status {
        502 if res.is_parent() => ("Bad Gateway", "Failed to connect parent proxy."),
        400 => (
            "Bad Request",
            "The proxy could not understand this request.",
        ),
        403 => (
            "Forbidden",
            "The proxy's access rules do not allow this request.",
        ),
        407 => (
            "Proxy Authentication Required",
            "This proxy needs a valid user name and password.",
        ),
        401 => (
            "Unauthorized",
            "The FTP server refused the login: give a user name and password.",
        ),
        404 => ("Not Found", "The FTP server has no such file."),
        409 => (
            "Conflict",
            "The FTP path is a directory: a file cannot be stored there.",
        ),
        411 => (
            "Length Required",
            "An upload through the FTP gateway needs a Content-Length.",
        ),
        431 => (
            "Request Header Fields Too Large",
            "The request head is larger than the proxy accepts.",
        ),
        501 => (
            "Not Implemented",
            "The proxy does not support this request.",
        ),
        503 if res == Res::SOCKET => (
            "Service Unavailable",
            "The proxy cannot open a connection now (out of file descriptors or memory): \
             try again later.",
        ),
        503 if res == Res::FILTER_DENY => (
            "Service Unavailable",
            "This request violates the proxy's filtering policy.",
        ),
        503 => (
            "Service Unavailable",
            "The proxy cannot serve this request now (a limit, or a loop).",
        ),
        504 => ("Gateway Timeout", "The server did not answer in time."),
        408 => (
            "Request Timeout",
            "The request head did not arrive in time.",
        ),
        _ => (
            "Bad Gateway",
            "The proxy could not reach the server, or the server's answer was broken.",
        ),
    };
    let body = format!(
        "<html><head><title>{status} {reason}</title></head>\r\n<body><h2>{status} {reason}</h2><p>{why}</p></body></html>\r\n"
    );
    let auth = match status {
        407 => "Proxy-Authenticate: Basic realm=\"proxy\"\r\n",
        401 => "WWW-Authenticate: Basic realm=\"FTP Server\"\r\n",
        _ => "",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\n{auth}Connection: close\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    match write_all_v(cli, head.as_bytes(), body.as_bytes()) {
        Ok(()) => head.len() + body.len(),
        Err(_) => 0,
    }
}

/// Write a page as it is (StringsPlugin's); the byte count sent.
pub(super) fn send_page(cli: &Stream, page: &[u8]) -> usize {
    match write_all_v(cli, page, &[]) {
        Ok(()) => page.len(),
        Err(_) => 0,
    }
}

/// After an error answer: stop sending, then read and drop what the client
/// still sends for a moment, so closing does not reset the connection and
/// destroy the answer before the client read it.
pub(super) fn linger(cli: &Stream, max: Duration) {
    let _ = cli.shutdown(Shutdown::Write);
    let wait = max.clamp(Duration::from_millis(100), Duration::from_secs(2));
    let _ = set_read_timeout(cli, wait);
    let mut sink = [0u8; 1024];
    let mut total = 0;
    let mut r = cli;
    while total < 256 * 1024 {
        match r.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(n) => total += n,
        }
    }
}

/// The code of an IO error on a body's socket: a used-up quota, a
/// timeout, or `other` (the side's error code).
fn io_res(e: &io::Error, other: Res) -> Res {
    if is_quota(e) {
        Res::QUOTA
    } else if crate::net::is_timeout(e) {
        Res::IDLE
    } else {
        other
    }
}

pub(super) fn cli_res(e: &io::Error) -> Res {
    io_res(e, Res::CLIENT_ERR)
}

pub(super) fn srv_res(e: &io::Error) -> Res {
    io_res(e, Res::SERVER_ERR)
}

/// Sending to the client failed: 521, or 92 on a timeout.
pub(super) fn send_res(e: &io::Error) -> Res {
    if crate::net::is_timeout(e) {
        Res::IDLE
    } else {
        Res::HTTP_SEND_CLIENT
    }
}
