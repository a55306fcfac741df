//! Handlers of the access-control commands (3proxy.cfg(5) "auth" to
//! "countall"; 3proxy's conf.c `h_auth`, `h_users`, `h_ace`, `h_nolog`,
//! `h_flush`, `h_counter`). They record what the line says in
//! `State::access`; services snapshot it (`access::Setup::snapshot`).

use std::sync::Arc;

use super::state::State;
use super::token::quote;
use super::value::number;
use crate::acl::{Action, Entry, Rule};
use crate::auth::{AuthType, CacheConf};
use crate::counter_file::CounterFile;
use crate::limit::{CountKind, Period};

/// `auth TYPE...`: the types later services try, in order.
pub fn h_auth(state: &mut State, args: &[String]) -> Result<(), String> {
    let types = args[1..]
        .iter()
        .map(|a| AuthType::parse(a))
        .collect::<Result<Vec<_>, _>>()?;
    if types.contains(&AuthType::Pam) && state.access.pam_service.is_none() {
        return Err(
            "auth type 'pam' comes with the PamAuth plugin: load it first \
             (plugin PamAuth.ld.so start SERVICE)"
                .into(),
        );
    }
    if types.contains(&AuthType::Ldap) {
        let Some(l) = state.ldap.as_mut() else {
            return Err(
                "auth type 'ldap' comes with the LdapPlugin plugin: load it first \
                 (plugin LdapPlugin.ld.so start)"
                    .into(),
            );
        };
        l.used = true;
    }
    if types.contains(&AuthType::Utf8ToCp1251) && !state.utf8tocp1251 {
        return Err(
            "auth type 'utf8tocp1251' comes with the utf8tocp1251 plugin: load it \
             first (plugin utf8tocp1251.ld.so utf8tocp1251)"
                .into(),
        );
    }
    state.access.auth = types;
    Ok(())
}

/// `authcache TYPES [TIME] [SIZE]`.
pub fn h_authcache(state: &mut State, args: &[String]) -> Result<(), String> {
    // TIME and SIZE are read with atoi in 3proxy; 0 means the default.
    let mut args = args[1..].to_vec();
    for a in args.iter_mut().skip(1) {
        *a = state.atoi(a, 0u64, u64::MAX)?.to_string();
    }
    state.access.cache = CacheConf::parse(&args)?;
    Ok(())
}

/// `users NAME:[TYPE:]PASSWORD...`: add to the process-wide table.
pub fn h_users(state: &mut State, args: &[String]) -> Result<(), String> {
    let mut users = state
        .access
        .users
        .write()
        .unwrap_or_else(|e| e.into_inner());
    let warn = users.add_line(&args[1..])?;
    drop(users);
    if let Some(why) = warn {
        state.lenient(why);
    }
    Ok(())
}

/// `flush`: empty the current ACL (services already started keep theirs).
pub fn h_flush(state: &mut State, _: &[String]) -> Result<(), String> {
    state.access.acl = Arc::default();
    Ok(())
}

/// `allow` and `deny`: append an entry to the current ACL.
pub fn h_ace(state: &mut State, args: &[String]) -> Result<(), String> {
    let action = if args[0] == "deny" {
        Action::Deny
    } else {
        Action::Allow
    };
    let rule = Rule::parse(&args[1..])?;
    Arc::make_mut(&mut state.access.acl).push(Entry {
        action,
        rule,
        nolog: false,
        parents: Default::default(),
    });
    Ok(())
}

/// `nolog` and `weight N`: modify the last ACL entry.
pub fn h_nolog(state: &mut State, args: &[String]) -> Result<(), String> {
    let weight = match args.get(1) {
        Some(w) => Some(state.atoi(w, 0u32, u32::MAX)?),
        None => None,
    };
    let acl = Arc::make_mut(&mut state.access.acl);
    let Some(last) = acl.last_mut() else {
        return Err("must follow an 'allow' or 'deny' line".into());
    };
    match weight {
        None => last.nolog = true,
        Some(w) => last.rule.weight = w,
    }
    Ok(())
}

/// `force` / `noforce`: whether a reload re-checks running sessions.
pub fn h_force(state: &mut State, args: &[String]) -> Result<(), String> {
    state.access.force = args[0] == "force";
    Ok(())
}

/// The key a limit's state is kept under across reloads: its line, and
/// which repetition of that line it is.
pub(super) fn limit_key(state: &mut State, args: &[String]) -> String {
    let line = args.join(" ");
    let n = state.access.seen.entry(line.clone()).or_insert(0);
    *n += 1;
    format!("{line}#{n}")
}

/// `bandlimin|bandlimout BPS rule...`, `nobandlimin|nobandlimout rule...`.
pub fn h_bandlim(state: &mut State, args: &[String]) -> Result<(), String> {
    let out = args[0].ends_with("out");
    let (bps, fields) = if args[0].starts_with("no") {
        (None, &args[1..])
    } else {
        (Some(number(&args[1], 300u64, u64::MAX / 2)?), &args[2..])
    };
    let rule = Rule::parse(fields)?;
    let key = limit_key(state, args);
    state.access.limits.add_bandlim(&key, out, bps, rule);
    Ok(())
}

/// `connlim N PERIOD rule...`, `noconnlim rule...`.
pub fn h_connlim(state: &mut State, args: &[String]) -> Result<(), String> {
    let (lim, fields) = if args[0] == "noconnlim" {
        (None, &args[1..])
    } else {
        let n = number(&args[1], 0u32, u32::MAX)?;
        let period = number(&args[2], 0u32, u32::MAX)?;
        (Some((n, period)), &args[3..])
    };
    let rule = Rule::parse(fields)?;
    let key = limit_key(state, args);
    state.access.limits.add_connlim(&key, lim, rule);
    Ok(())
}

/// `counter FILE [TYPE REPORTNAME]`: the counter file, and optionally a
/// report per period TYPE (`H`, `D`, `W`, `M`, ...) written to a file named
/// from REPORTNAME as `log` names its files. As in 3proxy, a TYPE without a
/// REPORTNAME is ignored.
pub fn h_counter(state: &mut State, args: &[String]) -> Result<(), String> {
    let report = match args {
        [_, _, t, name] => Some((Period::from_letter(t), name.clone())),
        _ => None,
    };
    if state.check_only {
        // `-t` must not create or change files; still say if an existing
        // one is bad or the place cannot be written.
        return CounterFile::check(&args[1]);
    }
    // The report thread starts when the cfg is committed (`main`).
    state.ops.reports = report.is_some();
    state
        .access
        .limits
        .set_counter_file(CounterFile::open(&args[1], state.ops.owner())?, report);
    Ok(())
}

/// `countin|countout|countall N[/COMMENT] PERIOD MB rule...` and
/// `nocountin|nocountout|nocountall rule...`.
pub fn h_count(state: &mut State, args: &[String]) -> Result<(), String> {
    let kind = match args[0].as_str() {
        "countin" => CountKind::In,
        "countout" => CountKind::Out,
        "countall" => CountKind::All,
        "nocountin" => CountKind::NoIn,
        "nocountout" => CountKind::NoOut,
        _ => CountKind::NoAll,
    };
    let (spec, fields) = if args[0].starts_with("no") {
        (None, &args[1..])
    } else {
        let (num, comment) = match args[1].split_once('/') {
            Some((n, c)) => (n, c.to_string()),
            None => (args[1].as_str(), String::new()),
        };
        let number = number(num, 0u32, 1 << 24)?;
        let period = Period::from_letter(&args[2]);
        let mb = number_mb(&args[3])?;
        (Some((number, comment, period, mb)), &args[4..])
    };
    let rule = Rule::parse(fields)?;
    let key = limit_key(state, args);
    state.access.limits.add_counter(&key, kind, spec, rule)
}

fn number_mb(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if n > 0 && n < (1 << 40) => Ok(n << 20),
        _ => Err(format!(
            "'{}' is not a traffic limit in megabytes (1 or more)",
            quote(s)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::commands::dispatch;
    use super::*;

    fn run(lines: &[&str]) -> Result<State, String> {
        let mut st = State::new(true);
        for l in lines {
            let args: Vec<String> = l.split_whitespace().map(String::from).collect();
            dispatch(&mut st, &args).map_err(|e| format!("{l}: {e}"))?;
        }
        Ok(st)
    }

    #[test]
    fn auth_types_and_default() {
        assert_eq!(run(&[]).unwrap().access.auth, [AuthType::IpOnly]);
        let st = run(&["auth iponly strong"]).unwrap();
        assert_eq!(st.access.auth, [AuthType::IpOnly, AuthType::Strong]);
        assert!(run(&["auth bogus"])
            .unwrap_err()
            .contains("unknown auth type"));
        let st = run(&["auth dnsname strong"]).unwrap();
        assert_eq!(st.access.auth, [AuthType::DnsName, AuthType::Strong]);
        let st = run(&["auth cache radius"]).unwrap();
        assert_eq!(st.access.auth, [AuthType::Cache, AuthType::Radius]);
        let st = run(&["authcache ip,user 60 10"]).unwrap();
        assert_eq!(
            st.access.cache,
            CacheConf {
                kind: 3,
                secs: 60,
                size: 10
            }
        );
        // `limit` goes with any other type, or alone, as in 3proxy.
        assert_eq!(run(&["authcache limit"]).unwrap().access.cache.kind, 8);
    }

    #[test]
    fn allow_deny_flush_nolog_weight() {
        let st = run(&["allow * 10.0.0.0/8", "nolog", "deny * * * 25", "weight 50"]).unwrap();
        assert_eq!(st.access.acl.len(), 2);
        assert!(st.access.acl[0].nolog && !st.access.acl[1].nolog);
        assert_eq!(st.access.acl[1].rule.weight, 50);
        assert_eq!(st.access.acl[1].action, Action::Deny);
        let st = run(&["allow *", "flush", "deny *"]).unwrap();
        assert_eq!(st.access.acl.len(), 1);
        assert!(run(&["nolog"]).unwrap_err().contains("must follow"));
        assert!(run(&["allow * nonsense"]).is_err());
    }

    #[test]
    fn a_service_keeps_the_acl_of_its_line() {
        let mut st = run(&["allow * 10.0.0.0/8"]).unwrap();
        let before = st.access.snapshot();
        h_flush(&mut st, &["flush".into()]).unwrap();
        assert_eq!(before.acl.len(), 1);
        assert_eq!(st.access.snapshot().acl.len(), 0);
    }

    #[test]
    fn users_are_shared_with_earlier_snapshots() {
        let mut st = run(&[]).unwrap();
        let early = st.access.snapshot();
        let args: Vec<String> = ["users", "a:b", "c:CL:d"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        h_users(&mut st, &args).unwrap();
        assert_eq!(early.users.read().unwrap().len(), 2);
    }

    #[test]
    fn limit_commands() {
        assert!(run(&[
            "bandlimin 57600 * 10.0.0.1",
            "nobandlimout * * * 110",
            "bandlimout 300"
        ])
        .is_ok());
        assert!(run(&["bandlimin 299 *"]).unwrap_err().contains("300"));
        assert!(run(&[
            "connlim 10 60 * 10.0.0.1",
            "noconnlim * 127.0.0.1",
            "connlim 2 0 *"
        ])
        .is_ok());
        assert!(run(&["connlim x 0 *"]).is_err());
        assert!(run(&[
            "countin 1/comment D 100 *",
            "nocountall * 10.0.0.1",
            "countall 0 M 5"
        ])
        .is_ok());
        assert!(run(&["countout 1 D 0 *"])
            .unwrap_err()
            .contains("megabytes"));
        // -t creates no file, but a place that cannot be written is an
        // error, as at a start.
        let tmp = std::env::temp_dir().join(format!("3proxy-ctr-{}", std::process::id()));
        let line = format!("counter {} D rep", tmp.display());
        assert!(run(&[&line]).is_ok());
        assert!(!tmp.exists(), "-t created {}", tmp.display());
        assert!(run(&["counter /nonexistent/x D rep"])
            .unwrap_err()
            .contains("/nonexistent/x"));
        assert!(run(&["force", "noforce"]).is_ok_and(|st| !st.access.force));
    }
}
