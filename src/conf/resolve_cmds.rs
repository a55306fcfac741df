//! The resolver's cfg commands (3proxy.cfg(5) "nserver" to "dialer";
//! 3proxy's `h_nserver`, `h_nscache`, ... in conf.c). Each records what
//! its line says in `State::resolver`; `State::finalize` installs the
//! result as the process's resolver (`crate::resolve`).

use super::state::State;
use super::value::{number, resolve_once};
use crate::resolve::{Mode, NameServer, MAX_SERVERS, MIN_CACHE};

/// Largest `nscache`/`nscache6` accepted.
const MAX_CACHE: usize = 1 << 24;

/// `nserver IP[:PORT][/tcp]`: one more server to ask, in order; turns the
/// built-in resolver on (and `fakeresolve` off, if it came before).
pub fn h_nserver(state: &mut State, args: &[String]) -> Result<(), String> {
    let ns = NameServer::parse(&args[1])?;
    let r = &mut state.resolver;
    if r.servers.len() < MAX_SERVERS {
        r.servers.push(ns);
    } else {
        log::warn!(
            "nserver {}: only the first {MAX_SERVERS} nserver lines are used",
            super::token::quote(&args[1])
        );
    }
    r.mode = Mode::Servers;
    Ok(())
}

/// `authnserver IP[:PORT][/tcp]`: the server for `auth dnsname`.
pub fn h_authnserver(state: &mut State, args: &[String]) -> Result<(), String> {
    state.resolver.auth_server = Some(NameServer::parse(&args[1])?);
    Ok(())
}

/// `fakeresolve`: every name is 127.0.0.2 (::2), until an `nserver`.
pub fn h_fakeresolve(state: &mut State, _: &[String]) -> Result<(), String> {
    state.resolver.mode = Mode::Fake;
    Ok(())
}

/// `nscache N`: cache up to N A answers.
pub fn h_nscache(state: &mut State, args: &[String]) -> Result<(), String> {
    state.resolver.cache4 = Some(number(&args[1], MIN_CACHE, MAX_CACHE)?);
    Ok(())
}

/// `nscache6 N`: cache up to N AAAA answers.
pub fn h_nscache6(state: &mut State, args: &[String]) -> Result<(), String> {
    state.resolver.cache6 = Some(number(&args[1], MIN_CACHE, MAX_CACHE)?);
    Ok(())
}

/// `nsrecord NAME ADDRESS`: a static answer; 0.0.0.0 makes NAME fail.
/// ADDRESS may itself be a name, resolved once, now (as in 3proxy).
pub fn h_nsrecord(state: &mut State, args: &[String]) -> Result<(), String> {
    let ip = resolve_once(&args[2])?;
    state.resolver.add_record(&args[1], ip);
    Ok(())
}

/// `dialer PROG`: run PROG (through /bin/sh) when a name does not
/// resolve, then try once more.
pub fn h_dialer(state: &mut State, args: &[String]) -> Result<(), String> {
    state.resolver.dialer = Some(args[1].clone());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::commands::run_lines as run;
    use super::*;

    #[test]
    fn nserver_keeps_five_in_order() {
        let lines: Vec<String> = (1..=7).map(|i| format!("nserver 10.0.0.{i}")).collect();
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let st = run(&lines).unwrap();
        let got: Vec<String> = st
            .resolver
            .servers
            .iter()
            .map(|s| s.addr.to_string())
            .collect();
        assert_eq!(
            got,
            [
                "10.0.0.1:53",
                "10.0.0.2:53",
                "10.0.0.3:53",
                "10.0.0.4:53",
                "10.0.0.5:53"
            ]
        );
        assert_eq!(st.resolver.mode, Mode::Servers);
        assert!(run(&["nserver nonsense"]).is_err());
    }

    #[test]
    fn the_last_of_nserver_and_fakeresolve_wins() {
        let st = run(&["nserver 10.0.0.1", "fakeresolve"]).unwrap();
        assert_eq!(st.resolver.mode, Mode::Fake);
        let st = run(&["fakeresolve", "nserver 10.0.0.1/tcp"]).unwrap();
        assert_eq!(st.resolver.mode, Mode::Servers);
        assert!(st.resolver.servers[0].tcp);
        assert_eq!(run(&[]).unwrap().resolver.mode, Mode::System);
    }

    #[test]
    fn nscache_sizes() {
        let st = run(&["nscache 256", "nscache6 65536"]).unwrap();
        assert_eq!(
            (st.resolver.cache4, st.resolver.cache6),
            (Some(256), Some(65536))
        );
        assert!(run(&["nscache 255"]).is_err());
        assert!(run(&["nscache6 0"]).is_err());
        assert!(run(&["nscache x"]).is_err());
    }

    #[test]
    fn nsrecord_by_family() {
        let st = run(&[
            "nsrecord Host.Test 10.1.1.1",
            "nsrecord host.test ::5",
            "nsrecord bad.test 0.0.0.0",
        ])
        .unwrap();
        let r = &st.resolver;
        assert_eq!(
            r.static4["host.test"],
            "10.1.1.1".parse::<std::net::Ipv4Addr>().unwrap()
        );
        assert_eq!(
            r.static6["host.test"],
            "::5".parse::<std::net::Ipv6Addr>().unwrap()
        );
        assert!(r.static4["bad.test"].is_unspecified());
    }

    #[test]
    fn authnserver_and_dialer() {
        let st = run(&["authnserver [::1]:5353", "dialer /bin/true"]).unwrap();
        assert_eq!(
            st.resolver.auth_server.map(|s| s.addr.to_string()),
            Some("[::1]:5353".into())
        );
        assert_eq!(st.resolver.dialer.as_deref(), Some("/bin/true"));
        // authnserver alone does not turn the built-in resolver on.
        assert_eq!(st.resolver.mode, Mode::System);
    }
}
