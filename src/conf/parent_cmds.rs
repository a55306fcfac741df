//! Handlers of the chaining commands: `parent`, `parentretries` and
//! `redirect` (3proxy.cfg(5); 3proxy's conf.c `h_parent`,
//! `h_parentretries`, and `redirect` in `h_ace`). A parent belongs to the
//! last ACL entry, which must be an `allow`; services snapshot the ACL
//! with its parents when their line runs.

use std::sync::Arc;
use std::time::Duration;

use super::state::State;
use super::token::quote;
use super::value::{number, resolve_once};
use crate::acl::{Action, Entry, Rule};
use crate::parent::{Hop, Kind};

/// `parent WEIGHT TYPE ADDRESS PORT [USER [PASSWORD]]`: add a parent to
/// the chain of the last `allow`.
pub fn h_parent(state: &mut State, args: &[String]) -> Result<(), String> {
    // 3proxy's table sets no upper count for `parent`: words after the
    // password are ignored, and a trailing comment in the user or password
    // place is taken as the user or password. We do the same, and say so.
    let words = &args[1..];
    let hop = Hop::parse(&words[..words.len().min(6)], resolve_once)?;
    // Where a comment seems to start (`//...`, `#...`), from the user on.
    let comment = words.iter().skip(4).position(|w| looks_like_comment(w));
    let mut parts = Vec::new();
    if let (Some(c), true) = (comment, words.len() > 4) {
        if c == 0 {
            parts.push(format!("takes '{}' as the user name", quote(&words[4])));
        }
        if c <= 1 && words.len() > 5 {
            let and = if c == 0 { "" } else { "takes " };
            parts.push(format!("{and}'{}' as the password", quote(&words[5])));
        }
    }
    if words.len() > 6 {
        parts.push(format!(
            "ignores '{}' after the password",
            quote(&words[6..].join(" "))
        ));
    }
    let hop = settle(state, hop, &words[..words.len().min(6)]);
    add(state, hop)?;
    if !parts.is_empty() {
        state.lenient(format!(
            "3proxy {}, and so do we (a comment must be a line of its own)",
            parts.join(" and ")
        ));
    }
    Ok(())
}

/// What a parent takes from the lines before it and from its identity:
/// `parenthealth`, its health kept across reloads by the words of its
/// line (`words`), the other family's address of a name (happy eyeballs),
/// and `parentcheck`.
fn settle(state: &mut State, mut hop: Hop, words: &[String]) -> Hop {
    hop.policy = state.parent_health;
    if hop.is_local() || matches!(hop.kind, Kind::ExtIp | Kind::Ha) {
        return hop;
    }
    hop.health = crate::health::shared(&words.join(" "), hop.name().to_string());
    if crate::net::parse_ip(&hop.host).is_none() {
        let other = if hop.addr.is_ipv4() {
            crate::net::Family::V6
        } else {
            crate::net::Family::V4
        };
        hop.alt = crate::resolve::resolve(&hop.host, 0, other)
            .ok()
            .map(|a| a.ip())
            .filter(|ip| ip.is_ipv4() != hop.addr.is_ipv4());
    }
    if let Some(check) = &state.parent_check {
        // From where is known once the services are (`State::finalize`).
        state.probes.push(crate::parentcheck::Probe {
            hop: hop.clone(),
            check: check.clone(),
            from: crate::net::Dialer::default(),
        });
    }
    hop
}

/// `parenthealth FAILS [HOLD [MAXHOLD]]` (threeproxy's own): the parents
/// that follow are down after FAILS failures in a row (0: never), for
/// HOLD seconds, doubled while they keep failing up to MAXHOLD.
pub fn h_parenthealth(state: &mut State, args: &[String]) -> Result<(), String> {
    let fails = number(&args[1], 0u32, 1000)?;
    let hold = match args.get(2) {
        Some(a) => number(a, 1u64, 86400)?,
        None => crate::health::DEFAULT_HOLD.as_secs(),
    };
    let max = match args.get(3) {
        Some(a) => number(a, 1u64, 86400)?,
        None => crate::health::DEFAULT_MAX_HOLD.as_secs().max(hold),
    };
    if max < hold {
        return Err(format!(
            "MAXHOLD {max} is shorter than HOLD {hold}: the hold only grows"
        ));
    }
    state.parent_health = crate::health::Policy {
        fails,
        hold: Duration::from_secs(hold),
        max_hold: Duration::from_secs(max),
    };
    Ok(())
}

/// `parentcheck INTERVAL [TIMEOUT [HOST:PORT]]` (threeproxy's own): check
/// the parents that follow every INTERVAL seconds (0: no checks), each
/// check within TIMEOUT seconds; `connect` parents are asked to CONNECT
/// to HOST:PORT.
pub fn h_parentcheck(state: &mut State, args: &[String]) -> Result<(), String> {
    let interval = number(&args[1], 0u64, 86400)?;
    if interval == 0 {
        state.parent_check = None;
        return Ok(());
    }
    let timeout = match args.get(2) {
        Some(a) => Duration::from_secs(number(a, 1u64, 3600)?),
        None => crate::parentcheck::DEFAULT_TIMEOUT,
    };
    let target = match args.get(3) {
        Some(t) => {
            let (host, port) = t
                .rsplit_once(':')
                .ok_or_else(|| format!("'{}' is not HOST:PORT", quote(t)))?;
            let host = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            let port = number(port, 1u16, 65535)?;
            if host.is_empty() {
                return Err(format!("'{}' is not HOST:PORT", quote(t)));
            }
            Some((host.to_string(), port))
        }
        None => None,
    };
    state.parent_check = Some(crate::parentcheck::Check {
        interval: Duration::from_secs(interval),
        timeout,
        target,
    });
    Ok(())
}

/// `happyeyeballs MS` (threeproxy's own): how long the first address of
/// a name with both families is tried alone before the other family's
/// (0: the first address only). Process-wide.
pub fn h_happyeyeballs(state: &mut State, args: &[String]) -> Result<(), String> {
    state.eyeballs = Duration::from_millis(number(&args[1], 0u64, 60000)?);
    Ok(())
}

/// A word that reads as the start of a comment (`#...`, `//...`).
fn looks_like_comment(w: &str) -> bool {
    w.starts_with('#') || w.starts_with("//")
}

fn add(state: &mut State, hop: Hop) -> Result<(), String> {
    let acl = Arc::make_mut(&mut state.access.acl);
    let Some(last) = acl.last_mut().filter(|e| e.action == Action::Allow) else {
        return Err("must follow an 'allow' or 'redirect' line".into());
    };
    let mut hops = last.parents.to_vec();
    hops.push(hop);
    last.parents = hops.into();
    Ok(())
}

/// `parentretries N`: attempts per request through a parent chain.
pub fn h_parentretries(state: &mut State, args: &[String]) -> Result<(), String> {
    // 3proxy reads the word with atoi and ignores what is not above 0.
    match super::value::atoi_number(&args[1], 0u32, 1000) {
        Ok((n, why)) if n >= 1 => {
            state.parent_retries = n;
            if let Some(why) = why {
                state.lenient(why);
            }
        }
        Ok((_, Some(_))) => state.lenient(format!(
            "'{}' is not a number; 3proxy reads it as 0 and ignores it: the retries stay {}",
            super::token::quote(&args[1]),
            state.parent_retries
        )),
        _ => return Err(number(&args[1], 1u32, 1000).unwrap_err()),
    }
    Ok(())
}

/// `redirect ADDRESS PORT [ACL fields]`: an `allow` whose requests go
/// to the HTTP proxy at ADDRESS:PORT (a one-hop `http` parent; `0.0.0.0
/// 0` hands them to the `proxy` handler in this process).
pub fn h_redirect(state: &mut State, args: &[String]) -> Result<(), String> {
    let rule = Rule::parse(&args[3..])?;
    let mut line = vec!["1000".to_string(), "http".to_string()];
    line.extend_from_slice(&args[1..3]);
    let hop = Hop::parse(&line, resolve_once)?;
    let hop = settle(state, hop, &line);
    debug_assert_eq!(hop.kind, Kind::Http);
    Arc::make_mut(&mut state.access.acl).push(Entry {
        action: Action::Allow,
        rule,
        nolog: false,
        parents: Default::default(),
    });
    add(state, hop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str) -> Result<State, String> {
        super::super::commands::run_lines(&text.lines().collect::<Vec<_>>())
    }

    #[test]
    fn parents_go_to_the_last_allow() {
        let st = run("allow *\ndeny * * 10.0.0.1\nallow * * 10.0.0.2\n\
             parent 500 socks5 127.0.0.1 1080\nparent 500 connect 127.0.0.1 3128 u p")
        .unwrap();
        let acl = &st.access.acl;
        assert!(acl[0].parents.is_empty() && acl[1].parents.is_empty());
        let p = &acl[2].parents;
        assert_eq!(p.len(), 2);
        assert_eq!((p[0].kind, p[1].kind), (Kind::Socks5, Kind::Connect));
        assert_eq!(p[1].user.as_deref(), Some("u"));
    }

    #[test]
    fn parent_needs_an_allow_before_it() {
        assert!(run("parent 1000 tcp 127.0.0.1 1")
            .unwrap_err()
            .contains("must follow"));
        assert!(run("deny *\nparent 1000 tcp 127.0.0.1 1")
            .unwrap_err()
            .contains("must follow"));
        assert!(run("allow *\nparent 0 tcp 127.0.0.1 1")
            .unwrap_err()
            .contains("weight"));
    }

    #[test]
    fn redirect_is_an_allow_with_an_http_parent() {
        let st = run("redirect 127.0.0.1 3128 * * * 80").unwrap();
        let e = &st.access.acl[0];
        assert_eq!(e.action, Action::Allow);
        assert_eq!(e.parents.len(), 1);
        assert_eq!(e.parents[0].kind, Kind::Http);
        assert_eq!(e.parents[0].weight, 1000);
        assert_eq!(e.parents[0].addr, "127.0.0.1:3128".parse().unwrap());
        // A redirect takes more parents, as 3proxy's does.
        let st = run("redirect 0.0.0.0 0\nparent 1000 socks5 127.0.0.1 1").unwrap();
        assert_eq!(st.access.acl[0].parents.len(), 2);
    }

    #[test]
    fn parenthealth_parentcheck_and_happyeyeballs() {
        let st = run(
            "parenthealth 5 2 8\nparentcheck 10 3 example.org:443\nhappyeyeballs 100\n\
             allow *\nparent 1000 connect 127.0.0.1 3128\nparentcheck 0\n\
             parenthealth 0\nparent 1000 socks5 127.0.0.1 1080",
        )
        .unwrap();
        let p = &st.access.acl[0].parents;
        assert_eq!(p[0].policy.fails, 5);
        assert_eq!(p[0].policy.hold, Duration::from_secs(2));
        assert_eq!(p[0].policy.max_hold, Duration::from_secs(8));
        assert_eq!(p[1].policy.fails, 0);
        assert_eq!(st.probes.len(), 1);
        assert_eq!(
            st.probes[0].check.target,
            Some(("example.org".to_string(), 443))
        );
        assert_eq!(st.probes[0].check.timeout, Duration::from_secs(3));
        assert_eq!(st.eyeballs, Duration::from_millis(100));
        // Defaults: 3 failures, 30 s, at most 300 s; no checks; 250 ms.
        let st = run("allow *\nparent 1000 socks5 127.0.0.1 1080").unwrap();
        let h = &st.access.acl[0].parents[0];
        assert_eq!(h.policy, crate::health::Policy::default());
        assert!(st.probes.is_empty());
        assert_eq!(st.eyeballs, Duration::from_millis(250));
        for (bad, why) in [
            ("parenthealth x", "x"),
            ("parenthealth 3 10 5", "shorter"),
            ("parenthealth 3 0", "0"),
            ("parentcheck 10 0", "0"),
            ("parentcheck 10 5 example.org", "HOST:PORT"),
            ("parentcheck 10 5 example.org:0", "0"),
            ("happyeyeballs -1", "-1"),
        ] {
            let e = run(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_same_line_keeps_its_health_across_loads() {
        let a = run("allow *\nparent 1000 socks5 127.0.0.1 1999").unwrap();
        let b = run("allow *\nparent 1000 socks5 127.0.0.1 1999").unwrap();
        let c = run("allow *\nparent 1000 socks5 127.0.0.1 1998").unwrap();
        let h = |st: &State| st.access.acl[0].parents[0].health.0.clone();
        assert!(Arc::ptr_eq(&h(&a), &h(&b)));
        assert!(!Arc::ptr_eq(&h(&a), &h(&c)));
    }

    #[test]
    fn parentretries() {
        assert_eq!(State::new(true).parent_retries, 2);
        assert_eq!(run("parentretries 5").unwrap().parent_retries, 5);
        assert!(run("parentretries 0").is_err());
    }
}
