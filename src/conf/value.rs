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
    crate::resolve::resolve(s, 0, crate::net::Family::V46)
        .map(|a| a.ip())
        .map_err(|_| format!("cannot resolve '{}'", quote(s)))
}

/// What C's `atoi` makes of `s`, which 3proxy reads many numbers with:
/// leading blanks, a sign and the digits that follow; 0 if there are none.
/// Saturates instead of overflowing.
pub fn atoi(s: &str) -> i64 {
    let t = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let mut v: i64 = 0;
    for b in digits.bytes().take_while(u8::is_ascii_digit) {
        v = v.saturating_mul(10).saturating_add(i64::from(b - b'0'));
    }
    if neg {
        -v
    } else {
        v
    }
}

/// A number in `lo..=hi` where 3proxy reads the word with `atoi`. A plain
/// number is taken as [`number`] takes it. A word that is not one (`random`,
/// `30days`) is read as `atoi` reads it, with a warning that says so (the
/// second value); that value must be in the range too.
pub fn atoi_number<T>(s: &str, lo: T, hi: T) -> Result<(T, Option<String>), String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy + TryFrom<i64>,
{
    if s.parse::<T>().is_ok() || s.parse::<i128>().is_ok() {
        return number(s, lo, hi).map(|v| (v, None));
    }
    let v = atoi(s);
    match T::try_from(v) {
        Ok(t) if t >= lo && t <= hi => Ok((t, Some(not_a_number(s, &v.to_string())))),
        _ => Err(format!(
            "'{}' is not a number from {lo} to {hi} (3proxy would read it as {v})",
            quote(s)
        )),
    }
}

/// The warning for a word 3proxy reads as the number `read`.
pub fn not_a_number(s: &str, read: &str) -> String {
    format!(
        "'{}' is not a number; read as {read}, as 3proxy reads it",
        quote(s)
    )
}

/// Where `internal` or `-i` says to listen, as 3proxy takes it: `unix:...`
/// and IP literals as they are; `:::` (not an address: 3proxy keeps the
/// family and listens on `::`) as `::`; any other word as a host name,
/// resolved once, now (IPv4 first). The text to listen on and, for the
/// lenient cases, the warning. A name that does not resolve is an error:
/// 3proxy would listen on the previous address, often every interface.
pub fn listen_addr(s: &str) -> Result<(String, Option<String>), String> {
    if s.starts_with("unix:") || crate::net::parse_ip(s).is_some() {
        crate::net::Addr::parse_listen(s, 0)?;
        return Ok((s.to_string(), None));
    }
    if s == ":::" {
        let why = "':::' is not an IPv6 address; listening on '::' (every IPv6 and IPv4 address), as 3proxy does";
        return Ok(("::".to_string(), Some(why.to_string())));
    }
    if s.is_empty() || s.contains(['[', ']', '/']) || s.matches(':').count() > 1 {
        return Err(format!("'{}' is not an IP address", quote(s)));
    }
    let (ip, why) = named_ip(s).map_err(|_| {
        format!(
            "'{}' is not an IP address, and as a host name it does not resolve",
            quote(s)
        )
    })?;
    Ok((ip.to_string(), why))
}

/// [`resolve_once`], and for a host name the warning that it was resolved
/// once, at load, as 3proxy resolves it.
pub fn named_ip(s: &str) -> Result<(IpAddr, Option<String>), String> {
    let ip = resolve_once(s)?;
    let why = crate::net::parse_ip(s).is_none().then(|| {
        format!(
            "'{}' is a host name, not an address; resolved once, now, to {ip}, as 3proxy does",
            quote(s)
        )
    });
    Ok((ip, why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atoi_reads_as_c_does() {
        for (s, v) in [
            ("12", 12),
            ("  -7x", -7),
            ("+3", 3),
            ("random", 0),
            ("", 0),
            ("30days", 30),
            ("99999999999999999999999", i64::MAX),
        ] {
            assert_eq!(atoi(s), v, "{s:?}");
        }
    }

    #[test]
    fn atoi_numbers_warn_for_words_only() {
        assert_eq!(atoi_number("5", 0u32, 9), Ok((5, None)));
        assert!(atoi_number("10", 0u32, 9).is_err());
        let (v, why) = atoi_number("x", 0u32, 9).unwrap();
        assert_eq!(v, 0);
        assert_eq!(
            why.as_deref(),
            Some("'x' is not a number; read as 0, as 3proxy reads it")
        );
        // What atoi makes of the word must be in the range too.
        assert!(atoi_number("x", 1u32, 9)
            .unwrap_err()
            .contains("3proxy would read it as 0"));
        assert!(atoi_number("-1x", 0u32, 9).is_err());
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(listen_addr("::"), Ok(("::".into(), None)));
        assert_eq!(listen_addr("unix:/x"), Ok(("unix:/x".into(), None)));
        let (a, why) = listen_addr(":::").unwrap();
        assert_eq!(a, "::");
        assert!(why.unwrap().contains("listening on '::'"));
        let (a, why) = listen_addr("localhost").unwrap();
        assert!(a == "127.0.0.1" || a == "::1", "{a}");
        assert!(why.unwrap().starts_with("'localhost' is a host name"));
        assert!(listen_addr("1::2::3").is_err());
        assert!(listen_addr("no-such-host.invalid").is_err());
    }
}
