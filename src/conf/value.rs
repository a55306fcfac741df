//! Values in cfg arguments that many commands and the service options
//! share: bounded numbers, addresses resolved once. Pure but for the one
//! lookup `resolve_once` makes (as 3proxy resolves `external` at its line).

use std::net::IpAddr;

use super::token::quote;

/// A decimal number in `lo..=hi`.
pub fn number<T>(s: &str, lo: T, hi: T) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    match s.parse::<T>() {
        Ok(v) if v >= lo && v <= hi => Ok(v),
        _ => Err(format!("'{}' is not a number from {lo} to {hi}", quote(s))),
    }
}

/// An address for `external`/`-e`: a literal, or a name resolved now,
/// once (3proxy resolves it at parse time too).
pub fn resolve_once(s: &str) -> Result<IpAddr, String> {
    if let Some(ip) = crate::net::parse_ip(s) {
        return Ok(ip);
    }
    crate::net::resolve(s, 0, crate::net::Family::V46)
        .map(|a| a.ip())
        .map_err(|_| format!("cannot resolve '{}'", quote(s)))
}
