//! The command table (3proxy's `commandhandlers[]` in conf.c): every cfg
//! command with its argument count and handler.
//!
//! Counts include the command's own name, as in 3proxy; `max == 0` means
//! no upper bound. The dispatcher alone checks the count; handlers get the
//! whole argument vector and return a reason on error, which `conf::run_text`
//! prefixes with file, line and command. Every command of 3proxy 1.0.0 is
//! in the table; a name of the PCRE plugin's family that is none of its
//! commands fails with "not supported yet" (not "unknown command"), so a
//! cfg never silently loses a line.

use std::net::IpAddr;
use std::sync::Arc;

use super::state::State;
use super::token::quote;
use super::value::{listen_addr, named_ip, number};
use super::{
    access_cmds, filter_cmds, ops_cmds, parent_cmds, plugin_cmds, radius_cmds, resolve_cmds,
    tls_cmds,
};
use crate::logformat::LogFormat;
use crate::services;

type Handler = fn(&mut State, &[String]) -> Result<(), String>;

/// One cfg command.
pub struct Command {
    pub name: &'static str,
    pub min: usize,
    pub max: usize,
    pub handler: Handler,
}

const fn cmd(name: &'static str, min: usize, max: usize, handler: Handler) -> Command {
    Command {
        name,
        min,
        max,
        handler,
    }
}

/// Every command 3proxy knows, in 3proxy.cfg(5)'s order of topics.
pub static COMMANDS: &[Command] = &[
    // Services: the rest of the line is service options.
    cmd("tcppm", 4, 0, h_service),
    cmd("udppm", 4, 0, h_service),
    cmd("proxy", 1, 0, h_service),
    cmd("socks", 1, 0, h_service),
    cmd("pop3p", 1, 0, h_service),
    cmd("imapp", 1, 0, h_service),
    cmd("smtpp", 1, 0, h_service),
    cmd("ftppr", 1, 0, h_service),
    cmd("tlspr", 1, 0, h_service),
    cmd("auto", 1, 0, h_service),
    cmd("admin", 1, 0, h_service),
    cmd("dnspr", 1, 0, h_service),
    // Settings read by the services that follow.
    cmd("internal", 2, 2, h_internal),
    cmd("external", 2, 2, h_external),
    cmd("maxconn", 2, 2, h_maxconn),
    cmd("reclaim", 2, 2, h_reclaim),
    cmd("minrate", 2, 3, h_minrate),
    cmd("backlog", 2, 2, h_backlog),
    cmd("timeouts", 2, 0, h_timeouts),
    cmd("stacksize", 2, 2, h_stacksize),
    cmd("maxseg", 2, 2, h_maxseg),
    cmd("parklinger", 2, 2, h_parklinger),
    cmd("log", 1, 0, ops_cmds::h_log),
    cmd("logformat", 2, 2, h_logformat),
    cmd("system", 2, 2, h_system),
    cmd("service", 1, 1, h_noop),
    // Process and operations.
    cmd("daemon", 1, 1, ops_cmds::h_daemon),
    cmd("pidfile", 2, 2, ops_cmds::h_pidfile),
    cmd("setuid", 2, 2, ops_cmds::h_setuid),
    cmd("setgid", 2, 2, ops_cmds::h_setgid),
    cmd("chroot", 2, 4, ops_cmds::h_chroot),
    cmd("config", 2, 2, ops_cmds::h_config),
    cmd("monitor", 2, 2, ops_cmds::h_monitor),
    cmd("writable", 1, 1, ops_cmds::h_writable),
    cmd("metricsusers", 2, 2, ops_cmds::h_metricsusers),
    cmd("force", 1, 1, access_cmds::h_force),
    cmd("noforce", 1, 1, access_cmds::h_force),
    cmd("rotate", 2, 2, ops_cmds::h_rotate),
    cmd("archiver", 3, 0, ops_cmds::h_archiver),
    cmd("logdump", 2, 3, ops_cmds::h_logdump),
    cmd("odbcqueue", 2, 2, ops_cmds::h_odbcqueue),
    cmd("delimchar", 2, 2, ops_cmds::h_delimchar),
    cmd("plugin", 3, 0, plugin_cmds::h_plugin),
    cmd("transparent", 1, 1, plugin_cmds::h_transparent),
    cmd("ldapconnect", 3, 4, plugin_cmds::h_ldapconnect),
    cmd("ldapaccess", 2, 2, plugin_cmds::h_ldap_value),
    cmd("ldapsbase", 2, 2, plugin_cmds::h_ldap_value),
    cmd("ldapuserenv", 2, 2, plugin_cmds::h_ldap_value),
    cmd("ldapdircount", 2, 2, plugin_cmds::h_ldap_value),
    cmd("ldapattr", 3, 4, plugin_cmds::h_ldapattr),
    cmd("ldaptrafgroup", 5, 5, plugin_cmds::h_ldaptrafgroup),
    cmd("notransparent", 1, 1, plugin_cmds::h_transparent),
    cmd("file_cachedir", 2, 2, plugin_cmds::h_file),
    cmd("file_preview", 2, 2, plugin_cmds::h_file),
    cmd("trafcorrect", 1, 10, plugin_cmds::h_trafcorrect),
    // Resolver.
    cmd("nserver", 2, 2, resolve_cmds::h_nserver),
    cmd("authnserver", 2, 2, resolve_cmds::h_authnserver),
    cmd("nscache", 2, 2, resolve_cmds::h_nscache),
    cmd("nscache6", 2, 2, resolve_cmds::h_nscache6),
    cmd("nsrecord", 3, 3, resolve_cmds::h_nsrecord),
    cmd("fakeresolve", 1, 1, resolve_cmds::h_fakeresolve),
    cmd("dialer", 2, 2, resolve_cmds::h_dialer),
    // Access control, parents and limits.
    cmd("auth", 2, 0, access_cmds::h_auth),
    cmd("authcache", 2, 4, access_cmds::h_authcache),
    cmd("users", 1, 0, access_cmds::h_users),
    cmd("flush", 1, 1, access_cmds::h_flush),
    cmd("allow", 1, 0, access_cmds::h_ace),
    cmd("deny", 1, 0, access_cmds::h_ace),
    cmd("redirect", 3, 0, parent_cmds::h_redirect),
    cmd("parent", 5, 0, parent_cmds::h_parent),
    cmd("parentretries", 2, 2, parent_cmds::h_parentretries),
    cmd("parenthealth", 2, 4, parent_cmds::h_parenthealth),
    cmd("parentcheck", 2, 4, parent_cmds::h_parentcheck),
    cmd("happyeyeballs", 2, 2, parent_cmds::h_happyeyeballs),
    cmd("nolog", 1, 1, access_cmds::h_nolog),
    cmd("weight", 2, 2, access_cmds::h_nolog),
    cmd("bandlimin", 2, 0, access_cmds::h_bandlim),
    cmd("bandlimout", 2, 0, access_cmds::h_bandlim),
    cmd("nobandlimin", 1, 0, access_cmds::h_bandlim),
    cmd("nobandlimout", 1, 0, access_cmds::h_bandlim),
    cmd("connlim", 4, 0, access_cmds::h_connlim),
    cmd("noconnlim", 1, 0, access_cmds::h_connlim),
    cmd("counter", 2, 4, access_cmds::h_counter),
    cmd("countin", 4, 0, access_cmds::h_count),
    cmd("countout", 4, 0, access_cmds::h_count),
    cmd("countall", 4, 0, access_cmds::h_count),
    cmd("nocountin", 1, 0, access_cmds::h_count),
    cmd("nocountout", 1, 0, access_cmds::h_count),
    cmd("nocountall", 1, 0, access_cmds::h_count),
    cmd("filtermaxsize", 2, 2, filter_cmds::h_filtermaxsize),
    // Filters.
    cmd("pcre", 4, 0, filter_cmds::h_pcre),
    cmd("pcre_rewrite", 5, 0, filter_cmds::h_pcre_rewrite),
    cmd("pcre_extend", 2, 0, filter_cmds::h_pcre_extend),
    cmd("pcre_options", 2, 0, filter_cmds::h_pcre_options),
    cmd("radius", 3, 0, radius_cmds::h_radius),
    cmd("radiusinterim", 2, 2, radius_cmds::h_radiusinterim),
    cmd("radiusdae", 3, 0, radius_cmds::h_radiusdae),
    // TLS (`conf::tls_cmds`): the server side, and TLS to parents.
    cmd("ssl_serv", 1, 1, tls_cmds::h_serv),
    cmd("ssl_server", 1, 1, tls_cmds::h_serv),
    cmd("ssl_noserv", 1, 1, tls_cmds::h_noserv),
    cmd("ssl_noserver", 1, 1, tls_cmds::h_noserv),
    cmd("ssl_server_cert", 1, 2, tls_cmds::h_server_cert),
    cmd("ssl_server_key", 1, 2, tls_cmds::h_server_key),
    cmd("ssl_server_ca_file", 1, 2, tls_cmds::h_server_ca_file),
    cmd("ssl_server_verify", 1, 1, tls_cmds::h_server_verify),
    cmd("ssl_server_no_verify", 1, 1, tls_cmds::h_server_verify),
    cmd(
        "ssl_server_min_proto_version",
        1,
        2,
        tls_cmds::h_server_version,
    ),
    cmd(
        "ssl_server_max_proto_version",
        1,
        2,
        tls_cmds::h_server_version,
    ),
    cmd(
        "ssl_client_min_proto_version",
        1,
        2,
        tls_cmds::h_client_version,
    ),
    cmd(
        "ssl_client_max_proto_version",
        1,
        2,
        tls_cmds::h_client_version,
    ),
    cmd("ssl_client_cert", 1, 2, tls_cmds::h_client_cert),
    cmd("ssl_client_key", 1, 2, tls_cmds::h_client_key),
    cmd("ssl_client_ca_file", 1, 2, tls_cmds::h_client_ca_file),
    cmd("ssl_client_verify", 1, 1, tls_cmds::h_client_verify),
    cmd("ssl_client_no_verify", 1, 1, tls_cmds::h_client_verify),
    cmd("ssl_client_sni", 1, 2, tls_cmds::h_client_sni),
    cmd("ssl_client_mode", 1, 2, tls_cmds::h_client_mode),
    cmd("ssl_cli", 1, 1, tls_cmds::h_cli),
    cmd("ssl_client", 1, 1, tls_cmds::h_cli),
    cmd("ssl_nocli", 1, 1, tls_cmds::h_nocli),
    cmd("ssl_noclient", 1, 1, tls_cmds::h_nocli),
    cmd("ssl_nomitm", 1, 1, tls_cmds::h_nomitm),
    cmd("ssl_mitm", 1, 1, tls_cmds::h_mitm),
    cmd("ssl_certcache", 2, 2, tls_cmds::h_certcache),
    cmd("ssl_server_ca_key", 1, 2, tls_cmds::h_server_ca_key),
    cmd("ssl_server_ca_dir", 1, 2, tls_cmds::h_ca_more),
    cmd("ssl_server_ca_store", 1, 2, tls_cmds::h_ca_more),
    cmd("ssl_client_ca_dir", 1, 2, tls_cmds::h_ca_more),
    cmd("ssl_client_ca_store", 1, 2, tls_cmds::h_ca_more),
    cmd("ssl_client_ciphersuites", 1, 2, tls_cmds::h_suites),
    cmd("ssl_server_ciphersuites", 1, 2, tls_cmds::h_suites),
    cmd("ssl_client_cipher_list", 1, 2, tls_cmds::h_suites),
    cmd("ssl_server_cipher_list", 1, 2, tls_cmds::h_suites),
    cmd("ssl_client_alpn", 1, 0, tls_cmds::h_client_alpn),
];

/// The PCRE plugin's family (`pcre*`): a name of it that is none of the
/// table's commands is refused as not supported yet, since a later 3proxy
/// may add it. (Every `ssl_*` command of 3proxy is in the table.)
const OPTIONAL_FAMILIES: &[&str] = &["pcre"];

/// Find a command and run it, checking the argument count first.
pub fn dispatch(state: &mut State, args: &[String]) -> Result<(), String> {
    let name = args[0].as_str();
    let Some(c) = COMMANDS.iter().find(|c| c.name == name) else {
        if OPTIONAL_FAMILIES.iter().any(|p| name.starts_with(p)) {
            return not_yet(state, args);
        }
        return Err("unknown command".into());
    };
    let n = args.len();
    if n < c.min || (c.max != 0 && n > c.max) {
        let want = match (c.min - 1, c.max) {
            (lo, 0) => format!("at least {lo}"),
            (lo, hi) if lo == hi - 1 => format!("{lo}"),
            (lo, hi) => format!("{lo} to {}", hi - 1),
        };
        return Err(format!(
            "wrong number of arguments: takes {want}, got {}",
            n - 1
        ));
    }
    (c.handler)(state, args)
}

fn not_yet(_: &mut State, args: &[String]) -> Result<(), String> {
    let _ = args;
    Err("not supported yet by this version of 3proxy".into())
}

fn h_noop(_: &mut State, _: &[String]) -> Result<(), String> {
    Ok(())
}

fn h_service(state: &mut State, args: &[String]) -> Result<(), String> {
    let prepared = services::prepare(state, args)?;
    if prepared.svc.opts.daemon {
        state.ops.daemon = true;
    }
    for why in prepared.svc.opts.warnings.iter() {
        state.lenient(why.clone());
    }
    if prepared.reuse.is_some() {
        state.claimed.push(prepared.key.clone());
    }
    state.services.push(prepared);
    Ok(())
}

fn h_internal(state: &mut State, args: &[String]) -> Result<(), String> {
    let (addr, why) = listen_addr(&args[1])?;
    state.internal = Some(addr);
    if let Some(why) = why {
        state.lenient(why);
    }
    Ok(())
}

fn h_external(state: &mut State, args: &[String]) -> Result<(), String> {
    let (ip, why) = named_ip(&args[1])?;
    if let Some(why) = why {
        state.lenient(why);
    }
    match ip {
        IpAddr::V4(_) => state.ext4 = Some(ip),
        IpAddr::V6(_) => state.ext6 = Some(ip),
    }
    Ok(())
}

fn h_maxconn(state: &mut State, args: &[String]) -> Result<(), String> {
    state.maxconn = number(&args[1], 1u32, 1_000_000)?;
    Ok(())
}

/// `reclaim 1|0`.
fn h_reclaim(state: &mut State, args: &[String]) -> Result<(), String> {
    state.reclaim = number(&args[1], 0u32, 1)? == 1;
    Ok(())
}

/// `minrate RATE [GRACE]`: bytes a second, seconds (3 when left out).
fn h_minrate(state: &mut State, args: &[String]) -> Result<(), String> {
    let rate = number(&args[1], 0u32, 1 << 30)?;
    let grace = match args.get(2) {
        Some(g) => number(g, 1u32, 86_400)?,
        None => crate::conf::state::MINRATE.1,
    };
    state.minrate = (rate, grace);
    Ok(())
}

fn h_backlog(state: &mut State, args: &[String]) -> Result<(), String> {
    state.backlog = state.atoi(&args[1], 0u32, 1 << 20)?;
    Ok(())
}

fn h_timeouts(state: &mut State, args: &[String]) -> Result<(), String> {
    // Values past the 11th are ignored, as in 3proxy.
    for (slot, a) in args[1..].iter().take(11).enumerate() {
        state.timeouts.0[slot] = number(a, 1u32, 2_000_000)?;
    }
    Ok(())
}

fn h_stacksize(state: &mut State, args: &[String]) -> Result<(), String> {
    state.stacksize = state.atoi(&args[1], -(1i64 << 20), 64 << 20)?;
    Ok(())
}

fn h_maxseg(state: &mut State, args: &[String]) -> Result<(), String> {
    // 0 (or a word atoi reads as 0) leaves TCP_MAXSEG unset, as in 3proxy.
    state.maxseg = state.atoi(&args[1], 0u32, 65535)?;
    Ok(())
}

fn h_parklinger(state: &mut State, args: &[String]) -> Result<(), String> {
    // At most a day: a longer linger is parking off in all but name.
    state.parklinger = crate::conf::value::number(&args[1], 0u32, 86_400_000)?;
    Ok(())
}

fn h_logformat(state: &mut State, args: &[String]) -> Result<(), String> {
    state.logformat = Arc::new(LogFormat::parse(&args[1]));
    Ok(())
}

fn h_system(state: &mut State, args: &[String]) -> Result<(), String> {
    if state.check_only {
        return Ok(());
    }
    // Like system(3): fatal only if the shell cannot be started.
    match std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(&args[1])
        .status()
    {
        Ok(st) => {
            if !st.success() {
                log::warn!("system: '{}' exited with {st}", quote(&args[1]));
            }
            Ok(())
        }
        Err(e) => Err(format!("cannot run /bin/sh: {e}")),
    }
}

/// For the tests of the `*_cmds` files: a new cfg state after
/// [`dispatch`] of each of `lines` (split at white space), or the first
/// error.
#[cfg(test)]
pub(super) fn run_lines(lines: &[&str]) -> Result<State, String> {
    let mut st = State::new(true);
    for line in lines {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        dispatch(&mut st, &args)?;
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split(' ').map(String::from).collect()
    }

    fn run(line: &str) -> Result<State, String> {
        let mut st = State::new(true);
        dispatch(&mut st, &args(line)).map(|_| st)
    }

    #[test]
    fn table_names_are_unique() {
        let mut names: Vec<_> = COMMANDS.iter().map(|c| c.name).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(n, names.len());
    }

    #[test]
    fn reclaim_and_minrate() {
        let st = State::new(true);
        assert!(st.reclaim);
        assert_eq!(st.minrate, (100, 3));
        let st = run_lines(&["reclaim 0", "minrate 500 10"]).unwrap();
        assert!(!st.reclaim);
        assert_eq!(st.minrate, (500, 10));
        assert_eq!(run("minrate 0").unwrap().minrate, (0, 3));
        assert!(run("reclaim 2").is_err());
        assert!(run("minrate 10 0").is_err());
        assert!(run("minrate x").is_err());
    }

    #[test]
    fn maxconn() {
        assert_eq!(run("maxconn 7").unwrap().maxconn, 7);
        assert!(run("maxconn 0")
            .unwrap_err()
            .contains("not a number from 1"));
        assert!(run("maxconn -1").is_err());
    }

    #[test]
    fn timeouts_set_the_first_n_slots() {
        let st = run("timeouts 2 3").unwrap();
        assert_eq!(st.timeouts.0, [2, 3, 30, 60, 180, 1800, 15, 60, 15, 5, 5]);
        let st = run("timeouts 1 1 1 1 1 1 1 1 1 1 1 99").unwrap();
        assert_eq!(st.timeouts.0, [1; 11]);
        assert!(run("timeouts 0").is_err());
        assert!(run("timeouts 2000001").is_err());
    }

    #[test]
    fn internal_and_external() {
        assert_eq!(
            run("internal 127.0.0.1").unwrap().internal.as_deref(),
            Some("127.0.0.1")
        );
        assert!(run("internal unix:/tmp/x").is_ok());
        assert!(run("internal nonsense").is_err());
        let st = run("external ::1").unwrap();
        assert_eq!(st.ext6, Some("::1".parse().unwrap()));
        assert_eq!(st.ext4, None);
    }

    #[test]
    fn later_commands_say_not_supported_yet() {
        let e = run("pcre_other x").unwrap_err();
        assert!(e.contains("not supported yet"), "pcre_other: {e}");
    }

    #[test]
    fn log_refuses_what_is_not_built() {
        assert!(run("log radius").is_ok());
        assert!(run("log /nonexistent/dir/file").is_err());
    }

    #[test]
    fn arity_message() {
        let e = run("internal").unwrap_err();
        assert_eq!(e, "wrong number of arguments: takes 1, got 0");
        let e = run("chroot").unwrap_err();
        assert_eq!(e, "wrong number of arguments: takes 1 to 3, got 0");
    }
}
