//! `radius SECRET SERVER[:PORT][/LOCAL] ...` (3proxy's `h_radius` in
//! conf.c): the servers `auth radius` and `log radius` use.

use std::net::SocketAddr;

use super::state::State;
use super::token::quote;
use super::value::named_ip;
use crate::radius::{Server, MAX_SECRET, MAX_SERVERS};

/// Port of a server given without one (RFC 2865).
const AUTH_PORT: u16 = 1812;

/// `radius`: replaces the servers of any earlier `radius` line, for every
/// service of the cfg, as 3proxy's global list is replaced.
pub fn h_radius(state: &mut State, args: &[String]) -> Result<(), String> {
    let mut secret = args[1].as_bytes().to_vec();
    if secret.len() > MAX_SECRET {
        state.lenient(format!(
            "the secret is longer than {MAX_SECRET} bytes; its first {MAX_SECRET} are used, as 3proxy does"
        ));
        secret.truncate(MAX_SECRET);
    }
    let mut servers = Vec::new();
    for a in &args[2..] {
        if servers.len() == MAX_SERVERS {
            state.lenient(format!(
                "only the first {MAX_SERVERS} servers are used, as in 3proxy; '{}' and later ones are not",
                quote(a)
            ));
            break;
        }
        let (s, why) = parse_server(a)?;
        if let Some(why) = why {
            state.lenient(why);
        }
        servers.push(s);
    }
    state.radius = Some((secret, servers));
    Ok(())
}

/// Longest `radiusinterim` interval: a day.
const MAX_INTERIM: u64 = 86_400;

/// `radiusinterim SECONDS` (threeproxy's own): every live `log radius`
/// session gets an Interim-Update this often; 0 (the default) for never,
/// as in 3proxy.
pub fn h_radiusinterim(state: &mut State, args: &[String]) -> Result<(), String> {
    let n: u64 = super::value::number(&args[1], 0, MAX_INTERIM)?;
    state.radius_interim = (n > 0).then(|| std::time::Duration::from_secs(n));
    Ok(())
}

/// `radiusdae [ADDRESS:]PORT SECRET [SOURCE[/BITS] ...]` (threeproxy's
/// own): the RFC 5176 listener (`crate::dae`). A port alone listens on
/// 127.0.0.1; without sources only loopback may send.
pub fn h_radiusdae(state: &mut State, args: &[String]) -> Result<(), String> {
    let a = &args[1];
    let addr = match a.parse::<u16>() {
        Ok(p) => SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), p),
        Err(_) => a.parse::<SocketAddr>().map_err(|_| {
            format!(
                "'{}' is not [ADDRESS:]PORT (an IPv6 address in brackets)",
                quote(a)
            )
        })?,
    };
    if addr.port() == 0 {
        return Err(format!(
            "'{}': give a port (RFC 5176's is {})",
            quote(a),
            crate::dae::DEFAULT_PORT
        ));
    }
    let secret = args[2].as_bytes().to_vec();
    if secret.is_empty() {
        return Err("the secret is empty".into());
    }
    let mut sources = Vec::new();
    for s in &args[3..] {
        let (ip, bits) = match s.split_once('/') {
            Some((ip, b)) => (ip, Some(b)),
            None => (s.as_str(), None),
        };
        let bad = || format!("'{}' is not an address or ADDRESS/BITS", quote(s));
        let ip = crate::addr::parse_ip(ip).ok_or_else(bad)?;
        let width = if ip.to_canonical().is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => width,
            Some(b) => b
                .parse::<u8>()
                .ok()
                .filter(|&b| b <= width)
                .ok_or_else(bad)?,
        };
        sources.push(crate::dae::Source { net: ip, bits });
    }
    let conf = crate::dae::Conf { secret, sources };
    state.dae = Some(crate::dae::prepare(addr, conf, !state.check_only)?);
    Ok(())
}

/// `SERVER[:PORT][/LOCAL]`: an address (IPv6 in brackets when a port
/// follows) or a name resolved once, now; the accounting port is the next
/// one. The second value is the warning for a name.
pub fn parse_server(s: &str) -> Result<(Server, Option<String>), String> {
    let (hostport, local) = match s.split_once('/') {
        Some((h, l)) => (h, Some(l)),
        None => (s, None),
    };
    let bad = || format!("'{}' is not SERVER[:PORT][/LOCAL_ADDRESS]", quote(s));
    let (host, port) = if crate::addr::parse_ip(hostport).is_some() {
        (hostport, None)
    } else if let Some(rest) = hostport.strip_prefix('[') {
        let (h, p) = rest.split_once("]:").ok_or_else(bad)?;
        (h, Some(p))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(bad());
    }
    let port = match port.map(str::parse::<u16>) {
        None | Some(Ok(0)) => AUTH_PORT,
        Some(Ok(65535)) => {
            return Err(format!(
                "'{}': port 65535 leaves no next port for accounting",
                quote(s)
            ))
        }
        Some(Ok(p)) => p,
        Some(Err(_)) => return Err(bad()),
    };
    let (ip, why) = named_ip(host)?;
    let local = match local {
        Some(l) => Some(
            crate::addr::parse_ip(l)
                .ok_or_else(|| format!("'{}' is not a local IP address", quote(l)))?,
        ),
        None => None,
    };
    Ok((
        Server {
            auth: SocketAddr::new(ip, port),
            acct: SocketAddr::new(ip, port + 1),
            local,
        },
        why,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn radiusdae_arguments() {
        let run = |args: &[&str]| {
            let mut st = State::new(true);
            let a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            h_radiusdae(&mut st, &a).map(|()| st.dae.unwrap())
        };
        let p = run(&["radiusdae", "3799", "s"]).unwrap();
        assert_eq!(p.addr.to_string(), "127.0.0.1:3799");
        assert!(p.conf.sources.is_empty());
        let p = run(&["radiusdae", "[::1]:3799", "s", "10.0.0.0/8", "::1"]).unwrap();
        assert_eq!(p.addr.to_string(), "[::1]:3799");
        assert_eq!(p.conf.sources.len(), 2);
        assert_eq!(p.conf.sources[1].bits, 128);
        for bad in [
            &["radiusdae", "x", "s"][..],
            &["radiusdae", "0", "s"],
            &["radiusdae", "3799", ""],
            &["radiusdae", "3799", "s", "10.0.0.0/33"],
            &["radiusdae", "3799", "s", "host.example"],
        ] {
            assert!(run(bad).is_err(), "{bad:?}");
        }
        let mut st = State::new(true);
        assert!(h_radiusinterim(&mut st, &["radiusinterim".into(), "30".into()]).is_ok());
        assert_eq!(st.radius_interim, Some(std::time::Duration::from_secs(30)));
        assert!(h_radiusinterim(&mut st, &["radiusinterim".into(), "0".into()]).is_ok());
        assert_eq!(st.radius_interim, None);
        assert!(h_radiusinterim(&mut st, &["radiusinterim".into(), "x".into()]).is_err());
    }

    #[test]
    fn servers() {
        let s = |t| parse_server(t).map(|(s, _)| (s.auth.to_string(), s.acct.to_string(), s.local));
        assert_eq!(
            s("10.0.0.1"),
            Ok(("10.0.0.1:1812".into(), "10.0.0.1:1813".into(), None))
        );
        assert_eq!(
            s("10.0.0.1:1645/10.0.0.9"),
            Ok((
                "10.0.0.1:1645".into(),
                "10.0.0.1:1646".into(),
                Some("10.0.0.9".parse().unwrap())
            ))
        );
        assert_eq!(
            s("[::1]:2000"),
            Ok(("[::1]:2000".into(), "[::1]:2001".into(), None))
        );
        assert_eq!(s("::1").map(|x| x.0), Ok("[::1]:1812".into()));
        for bad in [
            "10.0.0.1:x",
            "10.0.0.1:65535",
            "10.0.0.1/nothere",
            ":5",
            "[::1",
        ] {
            assert!(s(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_last_line_wins_and_long_secrets_are_cut() {
        let mut st = State::new(false);
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        h_radius(&mut st, &args(&["radius", "a", "127.0.0.1"])).unwrap();
        let long = "x".repeat(70);
        h_radius(
            &mut st,
            &args(&["radius", &long, "127.0.0.2", "127.0.0.3:99"]),
        )
        .unwrap();
        let (secret, servers) = st.radius.clone().unwrap();
        assert_eq!(secret.len(), 63);
        assert_eq!(servers.len(), 2);
        assert_eq!(servers[1].acct.port(), 100);
        assert_eq!(st.take_pending().len(), 1);
        let six: Vec<String> = ["radius", "s"]
            .iter()
            .map(|s| s.to_string())
            .chain((1..=6).map(|i| format!("127.0.0.{i}")))
            .collect();
        h_radius(&mut st, &six).unwrap();
        assert_eq!(st.radius.as_ref().unwrap().1.len(), 5);
    }
}
