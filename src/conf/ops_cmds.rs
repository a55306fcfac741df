//! The process and logging commands (3proxy.cfg(5): `daemon`, `pidfile`,
//! `setuid`, `setgid`, `chroot`, `config`, `monitor`, `writable`, `log`,
//! `rotate`, `archiver`, `logdump`, `delimchar`; conf.c `h_daemon` ...
//! `h_delimchar`). `force`/`noforce` live with the access commands.
//!
//! Handlers record what their line says in [`Ops`]; `main` acts on it once
//! the cfg has loaded and every listener is bound: fork for `daemon`, write
//! the pid file, then give up root (see `sys::process` for why that order
//! gives 3proxy's result). Two commands act at their line, as in 3proxy,
//! because later lines depend on them: `chroot` (later paths are inside the
//! new root) and `log` (the file is opened, so an error names the line).

use std::sync::Arc;

use super::ops::{LogDump, Monitor};
use super::state::State;
use super::token::quote;
use super::value::number;
use crate::log::{Period, Sink};
use crate::sqllog::{self, SqlLog};
use crate::sys::process::{self, PidFile};

pub fn h_daemon(state: &mut State, _: &[String]) -> Result<(), String> {
    state.ops.daemon = true;
    Ok(())
}

pub fn h_pidfile(state: &mut State, args: &[String]) -> Result<(), String> {
    // A reload leaves the pid file this process wrote alone.
    if process::pidfile_written(&args[1]) {
        return Ok(());
    }
    // Only checked here (an unwritable path is an error naming this line;
    // `-t` checks too): nothing is written before the cfg is committed.
    // Written as the user the lines before this one name, as 3proxy does.
    let f = PidFile::check(&args[1], state.ops.owner())
        .map_err(|e| format!("{}: {e}", quote(&args[1])))?;
    if !state.check_only {
        state.ops.pidfile = Some(f);
    }
    Ok(())
}

pub fn h_setuid(state: &mut State, args: &[String]) -> Result<(), String> {
    state.ops.uid = Some(process::uid_from(&args[1])?);
    Ok(())
}

pub fn h_setgid(state: &mut State, args: &[String]) -> Result<(), String> {
    state.ops.gid = Some(process::gid_from(&args[1])?);
    Ok(())
}

/// `chroot DIR [UID [GID]]`: the ids are looked up before the chroot (from
/// the system's user database, as 3proxy does) and applied after binding.
pub fn h_chroot(state: &mut State, args: &[String]) -> Result<(), String> {
    let uid = args.get(2).map(|u| process::uid_from(u)).transpose()?;
    let gid = args.get(3).map(|g| process::gid_from(g)).transpose()?;
    crate::log::syslog_preconnect();
    process::chroot(&args[1])?;
    if uid.is_some() {
        state.ops.uid = uid;
    }
    if gid.is_some() {
        state.ops.gid = gid;
    }
    Ok(())
}

pub fn h_config(state: &mut State, args: &[String]) -> Result<(), String> {
    state.ops.config = Some(args[1].clone());
    Ok(())
}

pub fn h_monitor(state: &mut State, args: &[String]) -> Result<(), String> {
    let m = Monitor::new(&args[1]);
    if m.seen.is_none() {
        // 3proxy only warns; the file is still watched, so creating it
        // later counts as a change.
        log::warn!("monitor: {} does not exist (yet)", quote(&args[1]));
    }
    state.ops.monitors.push(m);
    Ok(())
}

pub fn h_writable(state: &mut State, _: &[String]) -> Result<(), String> {
    state.ops.writable = true;
    Ok(())
}

/// `metricsusers N` (threeproxy's own): at most N users get series of
/// their own in the admin service's `/metrics`; the others are summed as
/// `user="other"`.
pub fn h_metricsusers(state: &mut State, args: &[String]) -> Result<(), String> {
    state.metricsusers = number(&args[1], 0usize, 1_000_000)?;
    Ok(())
}

/// `log`: stdout; `log FILE [PERIOD]`; `log @ident`; `log /dev/null`.
pub fn h_log(state: &mut State, args: &[String]) -> Result<(), String> {
    let owner = state.ops.owner();
    if let Some(spec) = args.get(1).and_then(|t| t.strip_prefix('&')) {
        if args.len() > 2 {
            return Err("log &DSN[,USER[,PASSWORD]] takes no rotation".into());
        }
        if state.check_only {
            SqlLog::check(spec)?;
            state.log = None;
            return Ok(());
        }
        state.log = Some(Arc::new(Sink::Sql(SqlLog::open(
            spec,
            state.ops.odbcqueue,
        )?)));
        return Ok(());
    }
    state.log = open_log_target(args, state.check_only, owner)?;
    Ok(())
}

/// The target a `log` line names; None for `/dev/null` (no logging).
/// With `check` (`3proxy -t`) a file is only checked, not opened (and
/// None is returned): the check creates no file.
pub fn open_log_target(
    args: &[String],
    check: bool,
    owner: process::Owner,
) -> Result<Option<Arc<Sink>>, String> {
    let Some(target) = args.get(1).map(String::as_str) else {
        return Ok(Some(Sink::stdout()));
    };
    if target == "/dev/null" {
        return Ok(None);
    }
    if let Some(ident) = target.strip_prefix('@') {
        return Ok(Some(Sink::syslog(ident)));
    }
    if target.starts_with('&') {
        return Err("ODBC logging is not supported here (only on a 'log' line)".into());
    }
    if target == "radius" {
        return Ok(Some(Arc::new(Sink::Radius)));
    }
    let period = match args.get(2) {
        None => Period::Never,
        Some(l) => Period::from_letter(l).unwrap_or_else(|| {
            // 3proxy takes an unknown letter for "never" without a word.
            log::warn!(
                "log {}: unknown rotation '{}' (c, H, D, W, M or Y): not rotated",
                quote(target),
                quote(l)
            );
            Period::Never
        }),
    };
    if check {
        return Sink::check_file(target, period)
            .map(|()| None)
            .map_err(|e| e.to_string());
    }
    Sink::rotating(target, period, owner)
        .map(Some)
        .map_err(|e| e.to_string())
}

pub fn h_rotate(state: &mut State, args: &[String]) -> Result<(), String> {
    state.ops.rotate = state.atoi(&args[1], 0u32, 1_000_000)?;
    Ok(())
}

pub fn h_archiver(state: &mut State, args: &[String]) -> Result<(), String> {
    state.ops.archiver = Some(args[1..].to_vec());
    Ok(())
}

pub fn h_logdump(state: &mut State, args: &[String]) -> Result<(), String> {
    let srv = state.atoi(&args[1], 0u64, u64::MAX)?;
    let cli = match args.get(2) {
        Some(a) => state.atoi(a, 0u64, u64::MAX)?,
        None => 0,
    };
    state.ops.logdump = LogDump { srv, cli };
    Ok(())
}

/// `odbcqueue N` (threeproxy's own): how many records each later
/// `log &...` target holds in memory while its database is away or slow.
pub fn h_odbcqueue(state: &mut State, args: &[String]) -> Result<(), String> {
    state.ops.odbcqueue = crate::conf::value::number(&args[1], 1, sqllog::MAX_QUEUE)?;
    Ok(())
}

pub fn h_delimchar(state: &mut State, args: &[String]) -> Result<(), String> {
    // 3proxy takes the first character of the word.
    state.ops.delimchar = *args[1]
        .as_bytes()
        .first()
        .ok_or("takes a character, got an empty word")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::commands::dispatch;
    use super::*;
    use nix::unistd::{Gid, Uid};

    fn args(line: &str) -> Vec<String> {
        line.split(' ').map(String::from).collect()
    }

    fn run(line: &str) -> Result<State, String> {
        let mut st = State::new(true);
        dispatch(&mut st, &args(line)).map(|_| st)
    }

    #[test]
    fn process_commands_are_recorded() {
        assert!(run("daemon").unwrap().ops.daemon);
        assert_eq!(
            run("setuid 65534").unwrap().ops.uid,
            Some(Uid::from_raw(65534))
        );
        assert_eq!(
            run("setgid 65534").unwrap().ops.gid,
            Some(Gid::from_raw(65534))
        );
        assert!(run("setuid 0").unwrap_err().contains("uid 0"));
        assert!(run("setgid root").is_err());
        assert!(run("setuid nosuchuser-xyz")
            .unwrap_err()
            .contains("no user"));
        // Ids are checked before any chroot is tried.
        assert!(run("chroot /nonexistent 0").unwrap_err().contains("uid 0"));
        assert!(run("chroot /nonexistent 65534 0")
            .unwrap_err()
            .contains("gid 0"));
    }

    #[test]
    fn reload_settings_are_recorded() {
        let st = run("config /etc/3proxy/3proxy.cfg").unwrap();
        assert_eq!(st.ops.config.as_deref(), Some("/etc/3proxy/3proxy.cfg"));
        assert!(run("writable").unwrap().ops.writable);
        // A missing file is only a warning, and stays watched.
        let st = run("monitor /nonexistent/x").unwrap();
        assert_eq!(st.ops.monitors.len(), 1);
        assert_eq!(st.ops.monitors[0].seen, None);
    }

    #[test]
    fn monitor_sees_a_change() {
        let p = std::env::temp_dir().join(format!("threeproxy-mon-{}", std::process::id()));
        std::fs::write(&p, "a").unwrap();
        let mut m = Monitor::new(p.to_str().unwrap());
        assert!(!m.changed());
        std::fs::write(&p, "ab").unwrap();
        assert!(m.changed());
        assert!(!m.changed());
        std::fs::remove_file(&p).unwrap();
        assert!(m.changed(), "a removed file is a change");
    }

    #[test]
    fn logging_settings() {
        assert_eq!(run("rotate 30").unwrap().ops.rotate, 30);
        // 3proxy reads a word with atoi: 0, with a warning here.
        let st = run("rotate random").unwrap();
        assert_eq!(st.ops.rotate, 0);
        assert_eq!(
            st.pending,
            ["'random' is not a number; read as 0, as 3proxy reads it"]
        );
        assert_eq!(run("rotate 7days").unwrap().ops.rotate, 7);
        assert!(run("rotate -x").is_ok());
        assert!(run("rotate -3").is_err());
        let st = run("archiver gz /bin/gzip %F").unwrap();
        assert_eq!(st.ops.archiver.unwrap(), ["gz", "/bin/gzip", "%F"]);
        assert_eq!(
            run("logdump 100 200").unwrap().ops.logdump,
            LogDump { srv: 100, cli: 200 }
        );
        assert_eq!(
            run("logdump 5").unwrap().ops.logdump,
            LogDump { srv: 5, cli: 0 }
        );
        assert_eq!(run("delimchar #").unwrap().ops.delimchar, b'#');
        assert_eq!(State::new(true).ops.delimchar, b'@');
        let mut st = State::new(true);
        assert!(dispatch(&mut st, &["delimchar".to_string(), String::new()]).is_err());
    }

    #[test]
    fn log_targets() {
        assert!(matches!(
            run("log").unwrap().log.as_deref(),
            Some(Sink::Stdout)
        ));
        assert!(run("log /dev/null").unwrap().log.is_none());
        assert!(matches!(
            run("log @3proxy").unwrap().log.as_deref(),
            Some(Sink::Syslog { ident }) if ident == "3proxy"
        ));
        // `-t` only checks the line; a real load makes the target (it
        // connects with the first record).
        assert!(run("log &dsn,user,pass").unwrap().log.is_none());
        let mut st = State::new(false);
        dispatch(&mut st, &args("log &dsn,user,pass")).unwrap();
        assert!(matches!(
            st.log.as_deref(),
            Some(Sink::Sql(db)) if db.name() == "&dsn"
        ));
        assert!(run("log &").unwrap_err().contains("data source"));
        assert!(run("log &,user").unwrap_err().contains("data source"));
        assert!(run("log &dsn D").unwrap_err().contains("rotation"));
        assert_eq!(run("odbcqueue 5").unwrap().ops.odbcqueue, 5);
        assert!(run("odbcqueue 0").is_err());
        assert!(run("odbcqueue many").is_err());
        assert!(matches!(
            run("log radius").unwrap().log.as_deref(),
            Some(Sink::Radius)
        ));
        assert!(run("log /nonexistent/dir/file D").is_err());
    }
}
