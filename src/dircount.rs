//! LdapPlugin's counter files (`ldapdircount DIR`): `ldaptrafgroup`
//! gives each member of a group a traffic counter kept in a text file of
//! its own, `DIR` + the user's name + `.lc`, one line of three decimal
//! numbers, "TRAF CLEARED UPDATED\n" (bytes counted in the period, Unix
//! times of the last reset and the last update). The file is read when
//! the cfg loads and written once a minute, as the plugin does, and at
//! exit and reload, which it does not (it loses up to a minute of
//! counting there). What a counter counts is `limit`'s; this module
//! knows it only as a [`Record`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use crate::counter_file::{Record, Saved};

/// How often the files are written (the plugin's job runs each minute).
const WRITE_EVERY: Duration = Duration::from_secs(60);

/// The saved state in a counter file's first line, if the file can be
/// read. As the plugin's `sscanf` reads it: numbers up to the first that
/// is not one; the missing ones are 0.
pub fn read(path: &str) -> Option<Saved> {
    let text = std::fs::read(path).ok()?;
    let line = text.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut nums = line
        .split_ascii_whitespace()
        .map_while(|w| w.parse::<u64>().ok())
        .fuse();
    let traf = nums.next().unwrap_or(0);
    let cleared = nums.next().unwrap_or(0);
    let updated = nums.next().unwrap_or(0);
    Some(Saved {
        traf,
        cleared: cleared.min(i64::MAX as u64) as i64,
        updated: updated.min(i64::MAX as u64) as i64,
    })
}

/// The line of `st`.
fn line(st: Saved) -> String {
    format!("{} {} {}\n", st.traf, st.cleared.max(0), st.updated.max(0))
}

struct Files {
    /// By path: the counters whose state the file keeps, oldest first;
    /// the newest still alive is written (a reload that fails drops its
    /// new counters, and the running cfg's goes on being written).
    kept: Mutex<HashMap<String, Vec<Weak<dyn Record>>>>,
    started: AtomicBool,
    /// Writing has failed and not succeeded since.
    failing: AtomicBool,
}

fn files() -> &'static Files {
    static F: OnceLock<Files> = OnceLock::new();
    F.get_or_init(|| Files {
        kept: Mutex::default(),
        started: AtomicBool::new(false),
        failing: AtomicBool::new(false),
    })
}

/// Keep `c`'s state in the file `path` from now on, once a minute (the
/// writer thread starts at the first call). A counter that is gone (its
/// cfg replaced without it) is no longer written.
pub fn keep(path: String, c: &Arc<dyn Record>) {
    let f = files();
    f.kept
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(path)
        .or_default()
        .push(Arc::downgrade(c));
    if !f.started.swap(true, Ordering::AcqRel) {
        let spawned = std::thread::Builder::new()
            .name("dircount".into())
            .spawn(|| loop {
                std::thread::sleep(WRITE_EVERY);
                flush();
            });
        if let Err(e) = spawned {
            log::error!("cannot start the ldapdircount writer: {e}; writing at exit only");
            f.started.store(false, Ordering::Release);
        }
    }
}

/// Write every kept counter's file now (each minute, at reload and at
/// exit). A file that cannot be written is reported once until one is
/// written again.
pub fn flush() {
    let f = files();
    let live: Vec<(String, Arc<dyn Record>)> = {
        let mut kept = f.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|_, v| {
            v.retain(|w| w.strong_count() > 0);
            !v.is_empty()
        });
        kept.iter()
            .filter_map(|(p, v)| Some((p.clone(), v.last()?.upgrade()?)))
            .collect()
    };
    let mut ok = false;
    for (path, c) in live {
        match std::fs::write(&path, line(c.saved())) {
            Ok(()) => ok = true,
            Err(e) => {
                if !f.failing.swap(true, Ordering::AcqRel) {
                    log::error!("ldapdircount file {path}: {e}; trying again each minute");
                }
            }
        }
    }
    if ok && f.failing.swap(false, Ordering::AcqRel) {
        log::warn!("ldapdircount files are written again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Saved);
    impl Record for Fixed {
        fn saved(&self) -> Saved {
            self.0
        }
    }

    #[test]
    fn a_file_is_read_as_the_plugin_reads_it_and_written_back() {
        let (dir, _) = crate::counter_file::tests::scratch("dircount");
        let path = dir.join("alice.lc");
        let p = path.to_str().unwrap().to_string();
        assert_eq!(read(&p), None, "no file");
        std::fs::write(&path, "123 1700000000 1700000100\nignored\n").unwrap();
        let st = Saved {
            traf: 123,
            cleared: 1_700_000_000,
            updated: 1_700_000_100,
        };
        assert_eq!(read(&p), Some(st));
        std::fs::write(&path, "77 x 5\n").unwrap();
        assert_eq!(
            read(&p),
            Some(Saved {
                traf: 77,
                ..Saved::default()
            }),
            "numbers up to the first that is not one"
        );
        std::fs::write(&path, "").unwrap();
        assert_eq!(read(&p), Some(Saved::default()));

        let c: Arc<dyn Record> = Arc::new(Fixed(Saved {
            traf: 5,
            cleared: 6,
            updated: 7,
        }));
        keep(p.clone(), &c);
        flush();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "5 6 7\n");
        // Gone: no longer written.
        drop(c);
        std::fs::write(&path, "1 1 1\n").unwrap();
        flush();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "1 1 1\n");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
