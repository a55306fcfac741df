#![allow(unsafe_code)]
//! The process itself: going to the background, the pid file, chroot and
//! giving up root (3proxy's `daemonize()` and conf.c `h_pidfile`,
//! `h_setuid`, `h_setgid`, `h_chroot`; 3proxy.cfg(5) `daemon`, `pidfile`,
//! `setuid`, `setgid`, `chroot`).
//!
//! When these run differs from 3proxy, on purpose; the result is the same:
//! - 3proxy forks at the `daemon` line, so `daemon` must precede every
//!   service (threads do not survive a fork). We load the whole cfg and bind
//!   every listener first, and fork afterwards, while the main thread is
//!   still the only thread. The pid file is written after the fork, so it
//!   always holds the pid of the process that serves (with 3proxy's
//!   recommended order, `daemon` then `pidfile`, that is what 3proxy writes).
//! - 3proxy changes uid/gid at the `setuid`/`setgid`/`chroot` line, so a
//!   service after it cannot bind a port below 1024. We change them after
//!   every listener is bound, so `setuid nobody` may come anywhere.
//! - `chroot` itself happens at its line, as in 3proxy: the paths of the
//!   commands after it (`include /conf/3proxy.cfg` in the packaged cfg, log
//!   files, pid file) name files inside the new root.
//!
//! Invariant: `daemonize` and `drop_privileges` run while the calling
//! thread is the process's only thread.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use nix::unistd::{self, AccessFlags, ForkResult, Gid, Group, Uid, User};

/// Fork into the background: the parent exits with status 0 at once, the
/// child starts a new session (3proxy's `daemonize`: no chdir, no umask, no
/// closing of descriptors, so a log to stdout keeps going where it went).
/// Only once per process: a reloaded cfg's `daemon` does nothing.
pub fn daemonize() -> io::Result<()> {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    // Threads do not survive a fork: a thread started while the cfg loaded
    // would silently be missing in the daemon. Refuse rather than lose it.
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        let n = tasks.count();
        if n > 1 {
            return Err(io::Error::other(format!(
                "{n} threads are running; background threads must start after the fork"
            )));
        }
    }
    // What the parent has buffered must not be written twice.
    let _ = io::stdout().flush();
    let _ = io::stderr().flush();
    // SAFETY: fork() in a process with threads may leave the child with
    // locks held by threads that no longer exist. The caller (main, after
    // the cfg has loaded and before any service starts) is the only thread:
    // the cfg is read on the main thread and no service, log writer or other
    // thread has been started yet, so the child inherits a consistent state.
    match unsafe { unistd::fork() }.map_err(io::Error::from)? {
        ForkResult::Parent { .. } => std::process::exit(0),
        ForkResult::Child => {
            unistd::setsid().map_err(io::Error::from)?;
            Ok(())
        }
    }
}

/// Whether `path` could be opened for writing (an existing file) or
/// created (its directory writable), without creating or changing
/// anything: `pidfile`, and `3proxy -t` for log and counter files.
pub fn check_writable(path: &Path) -> io::Result<()> {
    // Opening for writing without O_TRUNC or O_CREAT changes nothing.
    match OpenOptions::new().write(true).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            unistd::access(dir, AccessFlags::W_OK | AccessFlags::X_OK).map_err(io::Error::from)
        }
        Err(e) => Err(e),
    }
}

/// `pidfile`: when its line runs, the path is only checked (an existing
/// file must be writable, else its directory must be), so an unwritable
/// path is a cfg error with the line's number while a cfg that then fails
/// to load (a bad reload) has changed no file. The file is created and the
/// pid written once the cfg is committed and the process that will serve
/// exists (after `daemon`'s fork).
///
/// It is written as the user 3proxy is when it runs the line: 3proxy
/// changes ids at the `setuid`, `setgid` and `chroot` lines and writes the
/// file at the `pidfile` line, so after a `setuid` it writes it as that
/// user, before one as root. `owner` holds the ids of the lines read
/// before this one; with a user among them the file is written once root
/// is given up (`Ops::after_load`), with only a group, as root and given
/// to that group.
#[derive(Debug)]
pub struct PidFile {
    pub path: PathBuf,
    pub owner: Owner,
}

impl PidFile {
    pub fn check(path: &str, owner: Owner) -> io::Result<PidFile> {
        let p = Path::new(path);
        match owner.uid {
            Some(uid) if unistd::geteuid().is_root() => {
                check_writable_as(p, uid, owner.gid.unwrap_or_else(unistd::getegid))?
            }
            _ => check_writable(p)?,
        }
        Ok(PidFile {
            path: PathBuf::from(path),
            owner,
        })
    }

    /// Whether the file is to be written after giving up root: a user was
    /// named before the `pidfile` line.
    pub fn after_setuid(&self) -> bool {
        self.owner.uid.is_some()
    }

    /// Create (or empty) the file and write our pid, in decimal without a
    /// newline, as 3proxy does. A file created while root gets the group
    /// named before the line (3proxy's effective group then).
    pub fn write_pid(self) -> io::Result<()> {
        let mut opts = OpenOptions::new();
        opts.write(true).truncate(true);
        let mut file = open_or_create(&opts, &self.path, 0o666, self.owner)?;
        write!(file, "{}", std::process::id())?;
        file.flush()?;
        *WRITTEN.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.path);
        Ok(())
    }
}

/// [`check_writable`] for the user `uid` with the one group `gid` (what
/// `drop_privileges` leaves), while we are still root: by the mode bits of
/// the file, or of its directory if it does not exist (ACLs are not read).
fn check_writable_as(path: &Path, uid: Uid, gid: Gid) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let may = |m: &std::fs::Metadata, bits: u32| {
        let shift = if m.uid() == uid.as_raw() {
            6
        } else if m.gid() == gid.as_raw() {
            3
        } else {
            0
        };
        (m.mode() >> shift) & bits == bits
    };
    let denied = || io::Error::from(io::ErrorKind::PermissionDenied);
    match std::fs::metadata(path) {
        Ok(m) if may(&m, 0o2) => Ok(()),
        Ok(_) => Err(denied()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            if may(&std::fs::metadata(dir)?, 0o3) {
                Ok(())
            } else {
                Err(denied())
            }
        }
        Err(e) => Err(e),
    }
}

/// The pid file this process wrote, if any.
static WRITTEN: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Whether this process has written its pid to `path` already: a reloaded
/// cfg's `pidfile` line then leaves the file alone (after giving up root
/// it could not create it again).
pub fn pidfile_written(path: &str) -> bool {
    WRITTEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_deref()
        .is_some_and(|p| p == Path::new(path))
}

/// At a normal exit: remove the pid file if it still holds our pid. After
/// giving up root it may not be removable (one written as root); it then
/// stays, as 3proxy (which never removes it) leaves it.
pub fn remove_pidfile() {
    let Some(path) = WRITTEN.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    let ours =
        std::fs::read_to_string(&path).is_ok_and(|s| s.trim() == std::process::id().to_string());
    if ours {
        let _ = std::fs::remove_file(&path);
    }
}

/// A uid from a number or a user name. 0 (root) is refused, as in 3proxy:
/// dropping to root is a cfg mistake.
pub fn uid_from(s: &str) -> Result<Uid, String> {
    let by_name = |s: &str| User::from_name(s).map(|u| u.map(|u| u.uid));
    id_from(s, ("uid", "user"), Uid::from_raw, by_name)
}

/// A gid from a number or a group name; 0 is refused, as in 3proxy.
pub fn gid_from(s: &str) -> Result<Gid, String> {
    let by_name = |s: &str| Group::from_name(s).map(|g| g.map(|g| g.gid));
    id_from(s, ("gid", "group"), Gid::from_raw, by_name)
}

/// [`uid_from`] and [`gid_from`]: `s` as a number (`from_raw`) or else a
/// name looked up with `by_name`; 0 is refused. `what` names the id and
/// what its names are of (`("uid", "user")`) in the errors.
fn id_from<T: Copy + Into<u32>>(
    s: &str,
    what: (&str, &str),
    from_raw: fn(u32) -> T,
    by_name: impl FnOnce(&str) -> nix::Result<Option<T>>,
) -> Result<T, String> {
    let (id, of) = what;
    let q = crate::conf::token::quote(s);
    let v = if s.starts_with(|c: char| c.is_ascii_digit()) {
        s.parse::<u32>()
            .map(from_raw)
            .map_err(|_| format!("'{q}' is not a {id}"))?
    } else {
        match by_name(s) {
            Ok(Some(v)) => v,
            Ok(None) => return Err(format!("no {of} named '{q}'")),
            Err(e) => return Err(format!("cannot look up {of} '{q}': {e}")),
        }
    };
    if v.into() == 0 {
        return Err(format!("refusing to run as {id} 0 ('{q}')"));
    }
    Ok(v)
}

/// Who is to own the files the cfg creates while we are still root: the
/// user and group of the `setuid`/`setgid`/`chroot` lines read so far.
/// 3proxy gives up root at those lines, so a file a later line creates
/// (a log, the counter file) belongs to that user; we give up root only
/// once every listener is bound, and hand such a file over instead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owner {
    pub uid: Option<Uid>,
    pub gid: Option<Gid>,
}

/// Open `path` with `opts` (which must not create), creating it first
/// with `mode` (before the umask) if it does not exist. A file created
/// while we are root is given to `owner`; one that existed keeps its
/// owner and mode. After root is given up, files are the user's anyway.
pub fn open_or_create(
    opts: &OpenOptions,
    path: &Path,
    mode: u32,
    owner: Owner,
) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut create = opts.clone();
    create.create_new(true).mode(mode);
    match create.open(path) {
        Ok(f) => {
            let handover = owner.uid.is_some() || owner.gid.is_some();
            if handover && unistd::geteuid().is_root() {
                unistd::fchown(&f, owner.uid, owner.gid).map_err(io::Error::from)?;
            }
            Ok(f)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => opts.open(path),
        Err(e) => Err(e),
    }
}

/// Give up root: the group first (it needs root), then the user. Real,
/// effective and saved ids all change, so root cannot be taken back. As
/// root, the supplementary groups are reduced to the new (or current)
/// group; 3proxy keeps root's, which can include privileged groups.
pub fn drop_privileges(uid: Option<Uid>, gid: Option<Gid>) -> Result<(), String> {
    // What a reload asks again is already done.
    let uid = uid.filter(|&u| unistd::getuid() != u || unistd::geteuid() != u);
    let gid = gid.filter(|&g| unistd::getgid() != g || unistd::getegid() != g);
    if unistd::geteuid().is_root() && (uid.is_some() || gid.is_some()) {
        let g = gid.unwrap_or_else(unistd::getegid);
        unistd::setgroups(&[g]).map_err(|e| format!("setgroups({g}): {e}"))?;
    }
    if let Some(g) = gid {
        unistd::setresgid(g, g, g).map_err(|e| format!("cannot set gid {g}: {e}"))?;
    }
    if let Some(u) = uid {
        unistd::setresuid(u, u, u).map_err(|e| format!("cannot set uid {u}: {e}"))?;
    }
    Ok(())
}

/// The directory we chrooted to, once we have.
static CHROOT: OnceLock<PathBuf> = OnceLock::new();

/// `chroot DIR`: change the root directory and go to its `/`. Done once per
/// process: later calls (a reloaded cfg runs its `chroot` line again) do
/// nothing and succeed, as in 3proxy.
pub fn chroot(dir: &str) -> Result<(), String> {
    if CHROOT.get().is_some() {
        return Ok(());
    }
    let q = crate::conf::token::quote(dir);
    unistd::chroot(dir).map_err(|e| format!("cannot chroot to {q}: {e}"))?;
    unistd::chdir("/").map_err(|e| format!("chdir / in {q}: {e}"))?;
    let trimmed = dir.trim_end_matches('/');
    let _ = CHROOT.set(PathBuf::from(if trimmed.is_empty() {
        "/"
    } else {
        trimmed
    }));
    Ok(())
}

/// The chroot directory, if `chroot` has run.
pub fn chroot_dir() -> Option<&'static Path> {
    CHROOT.get().map(PathBuf::as_path)
}

/// A path named before the chroot (the cfg file on the command line), as
/// seen from inside it: the chroot prefix is taken off, so a reload can open
/// the file again (3proxy strips `chrootp` the same way). A path outside the
/// chroot is returned as it is.
pub fn path_in_chroot(path: &Path) -> PathBuf {
    let Some(root) = chroot_dir() else {
        return path.to_path_buf();
    };
    match path.strip_prefix(root) {
        Ok(rest) => Path::new("/").join(rest),
        Err(_) => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_by_number_and_name() {
        assert_eq!(uid_from("65534").unwrap().as_raw(), 65534);
        assert_eq!(gid_from("65534").unwrap().as_raw(), 65534);
        assert!(uid_from("0").unwrap_err().contains("uid 0"));
        assert!(uid_from("root").unwrap_err().contains("uid 0"));
        assert!(gid_from("0").unwrap_err().contains("gid 0"));
        assert!(uid_from("no-such-user-here")
            .unwrap_err()
            .contains("no user"));
        assert!(gid_from("no-such-group-here")
            .unwrap_err()
            .contains("no group"));
        assert!(uid_from("12x").is_err());
        // The messages name the id and what was looked up, as written.
        assert_eq!(uid_from("12x").unwrap_err(), "'12x' is not a uid");
        assert_eq!(gid_from("7y").unwrap_err(), "'7y' is not a gid");
        assert_eq!(gid_from("0").unwrap_err(), "refusing to run as gid 0 ('0')");
        assert_eq!(
            gid_from("no-such-group-here").unwrap_err(),
            "no group named 'no-such-group-here'"
        );
    }

    #[test]
    fn paths_outside_any_chroot_stay() {
        // No chroot in unit tests.
        assert_eq!(
            path_in_chroot(Path::new("/etc/x.cfg")),
            Path::new("/etc/x.cfg")
        );
    }
}
