//! The settings of the process and logging commands (`conf::ops_cmds`),
//! which `main` acts on once the cfg has loaded.

use std::path::PathBuf;
use std::time::SystemTime;

use nix::unistd::{Gid, Uid};

use super::token::quote;
use crate::sys::process::{self, PidFile};

/// What the process and logging commands said.
#[derive(Debug)]
pub struct Ops {
    /// `daemon` or a service's `-d`: fork into the background after loading.
    pub daemon: bool,
    /// `pidfile`: checked at its line; created and written only when the
    /// cfg is committed (after the fork), so a cfg that fails to load
    /// leaves every pid file as it was; as the user of the lines before it.
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
    /// `odbcqueue N`: the queue of each later `log &...` target.
    pub odbcqueue: usize,
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
            odbcqueue: crate::sqllog::DEFAULT_QUEUE,
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

    /// Who gets the files the cfg creates from here on while we are root
    /// (`setuid`, `setgid`, `chroot` read so far).
    pub fn owner(&self) -> process::Owner {
        process::Owner {
            uid: self.uid,
            gid: self.gid,
        }
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
    /// background, write the pid file, give up root; a pid file whose
    /// line follows a `setuid` (or `chroot`'s user) is written after
    /// giving up root, as that user, as 3proxy writes it. Safe to call
    /// again after a reload: what is done already is not done twice.
    pub fn after_load(&mut self) -> Result<(), String> {
        if self.daemon {
            process::daemonize().map_err(|e| format!("daemon: cannot fork: {e}"))?;
        }
        let (as_root, as_user) = match self.pidfile.take() {
            Some(p) if p.after_setuid() => (None, Some(p)),
            p => (p, None),
        };
        write_pid(as_root)?;
        process::drop_privileges(self.uid, self.gid)?;
        write_pid(as_user)
    }
}

fn write_pid(pidfile: Option<PidFile>) -> Result<(), String> {
    let Some(p) = pidfile else {
        return Ok(());
    };
    let path = p.path.display().to_string();
    p.write_pid()
        .map_err(|e| format!("pidfile {}: {e}", quote(&path)))
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
