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
