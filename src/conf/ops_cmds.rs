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

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use nix::unistd::{Gid, Uid};

use super::commands::number;
use super::quote;
use super::State;
use crate::log::{Period, Sink};
use crate::sys::process::{self, PidFile};

/// What the process and logging commands said.
#[derive(Debug)]
pub struct Ops {
    /// `daemon` or a service's `-d`: fork into the background after loading.
    pub daemon: bool,
    /// `pidfile`: checked at its line; created and written only when the
    /// cfg is committed (after the fork), so a cfg that fails to load
    /// leaves every pid file as it was.
    pub pidfile: Option<PidFile>,
    /// `setuid`, or `chroot`'s uid: applied after every listener is bound.
    pub uid: Option<Uid>,
    /// `setgid`, or `chroot`'s gid.
    pub gid: Option<Gid>,
    /// `config FILE`: the file a reload reads (default: the command line's).
    /// Named as seen after any `chroot`.
    pub config: Option<String>,
    /// `monitor FILE`: files whose change triggers a reload (checked once a
    /// minute). The reload itself is wired by `main`'s reload code.
    pub monitors: Vec<Monitor>,
    /// `writable`: the cfg file may be rewritten (by the admin service's
    /// cfg upload) before it is reread.
    pub writable: bool,
    /// `rotate N`: on rotation, the log file N periods old is deleted.
    pub rotate: u32,
    /// `archiver EXT CMD...`, EXT first.
    pub archiver: Option<Vec<String>>,
    /// `logdump IN OUT`: write an intermediate record when a session has
    /// received IN bytes from the server or sent OUT bytes from the client
    /// since its last record (0 = never). `State::finalize` hands the
    /// thresholds to every service; the relay writes the records.
    pub logdump: LogDump,
    /// `delimchar C`: separates user and host in `user@host` logins of
    /// 3proxy's FTP/POP3/SMTP/IMAP proxies and in the credentials of an
    /// HTTP proxy URL. Default `@`. `State::finalize` hands it to every
    /// service (`Service::delimchar`).
    pub delimchar: u8,
    /// `counter FILE TYPE REPORTNAME`: the cfg writes counter reports. The
    /// thread that writes them starts when the cfg is committed, after
    /// `daemon`'s fork (threads do not survive a fork).
    pub reports: bool,
}

impl Default for Ops {
    fn default() -> Ops {
        Ops {
            daemon: false,
            pidfile: None,
            uid: None,
            gid: None,
            config: None,
            monitors: Vec::new(),
            writable: false,
            rotate: 0,
            archiver: None,
            logdump: LogDump::default(),
            delimchar: b'@',
            reports: false,
        }
    }
}

impl Ops {
    /// After the whole cfg has run, when it is the one that will serve:
    /// hand the process-wide log settings to the log writer, and let its
    /// rotating files take over rotation.
    pub fn finalize(&self) {
        crate::log::set_rotation(self.rotate, self.archiver.clone());
        crate::log::commit_files();
    }

    /// The file a reload reads: `config`'s, else the command line's `cmdline`
    /// as seen from inside a `chroot`.
    pub fn reload_path(&self, cmdline: &str) -> PathBuf {
        match &self.config {
            Some(c) => PathBuf::from(c),
            None => process::path_in_chroot(std::path::Path::new(cmdline)),
        }
    }

    /// Whether a `monitor`ed file changed since the last call. The reload
    /// code calls this at least once a minute and reloads on true.
    pub fn monitors_changed(&mut self) -> bool {
        // Look at every file, so each one's new state is remembered.
        self.monitors
            .iter_mut()
            .fold(false, |any, m| m.changed() | any)
    }

    /// Once the cfg has loaded and every listener is bound, before any
    /// service starts (the main thread is the only thread): go to the
    /// background, write the pid file, give up root. Safe to call again
    /// after a reload: what is done already is not done twice.
    pub fn after_load(&mut self) -> Result<(), String> {
        if self.daemon {
            process::daemonize().map_err(|e| format!("daemon: cannot fork: {e}"))?;
        }
        if let Some(p) = self.pidfile.take() {
            let path = p.path.display().to_string();
            p.write_pid()
                .map_err(|e| format!("pidfile {}: {e}", quote(&path)))?;
        }
        process::drop_privileges(self.uid, self.gid)
    }
}

/// `logdump` thresholds, in bytes; 0 turns a direction off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogDump {
    /// Bytes from the server (3proxy's `logdumpsrv`, the first number).
    pub srv: u64,
    /// Bytes from the client (`logdumpcli`, the second number).
    pub cli: u64,
}

/// A `monitor`ed file and what it looked like when last seen (3proxy's
/// `filemon`: modification time and size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Monitor {
    pub path: PathBuf,
    /// None while the file does not exist.
    pub seen: Option<(SystemTime, u64)>,
}

impl Monitor {
    pub fn new(path: &str) -> Monitor {
        let path = PathBuf::from(path);
        let seen = Monitor::look(&path);
        Monitor { path, seen }
    }

    fn look(path: &std::path::Path) -> Option<(SystemTime, u64)> {
        let m = std::fs::metadata(path).ok()?;
        Some((m.modified().ok()?, m.len()))
    }

    /// Whether the file's time or size changed since the last call (or
    /// since it was named); a file that appears or vanishes counts too.
    pub fn changed(&mut self) -> bool {
        let now = Monitor::look(&self.path);
        let changed = now != self.seen;
        self.seen = now;
        changed
    }
}

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
    let f = PidFile::check(&args[1]).map_err(|e| format!("{}: {e}", quote(&args[1])))?;
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

/// `log`: stdout; `log FILE [PERIOD]`; `log @ident`; `log /dev/null`.
pub fn h_log(state: &mut State, args: &[String]) -> Result<(), String> {
    state.log = open_log_target(args)?;
    Ok(())
}

/// The target a `log` line names; None for `/dev/null` (no logging).
pub fn open_log_target(args: &[String]) -> Result<Option<Arc<Sink>>, String> {
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
        return Err("ODBC logging is not supported".into());
    }
    if target == "radius" {
        return Err("RADIUS accounting is not supported yet".into());
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
    Sink::rotating(target, period)
        .map(Some)
        .map_err(|e| e.to_string())
}

pub fn h_rotate(state: &mut State, args: &[String]) -> Result<(), String> {
    state.ops.rotate = number(&args[1], 0u32, 1_000_000)?;
    Ok(())
}

pub fn h_archiver(state: &mut State, args: &[String]) -> Result<(), String> {
    state.ops.archiver = Some(args[1..].to_vec());
    Ok(())
}

pub fn h_logdump(state: &mut State, args: &[String]) -> Result<(), String> {
    let srv = number(&args[1], 0u64, u64::MAX)?;
    let cli = match args.get(2) {
        Some(a) => number(a, 0u64, u64::MAX)?,
        None => 0,
    };
    state.ops.logdump = LogDump { srv, cli };
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
        assert!(run("rotate x").is_err());
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
        assert!(run("log &dsn").unwrap_err().contains("ODBC"));
        assert!(run("log /nonexistent/dir/file D").is_err());
    }
}
