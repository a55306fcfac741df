//! The `counter` file (3proxy's, `counter FILE`): its format, and the
//! two threads that keep it and the reports, each waking once a second:
//! the writer of changed records, and the report ticker of the cfg that
//! last named a report (3proxy.c `dumpcounters`). What a counter counts,
//! its periods and what a report says are `limit`'s, a layer above: this
//! module knows a counter only as a [`Record`] whose [`Saved`] state it
//! writes, and the cfg as the [`Reports`] it asks at each tick.
//!
//! Counter file layout (3proxy's, native byte order, 64-bit time_t): a
//! 16-byte header `"3CF\0"` + the time of the last update, then one 24-byte
//! record per counter number N at offset 16 + (N-1)*24: bytes counted, time
//! the counter was last reset, time it was last updated.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use crate::conf::token::quote;

/// One counter's record: bytes counted in its period, when it was last
/// reset and last updated (Unix seconds, 0 = never).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Saved {
    pub traf: u64,
    pub cleared: i64,
    pub updated: i64,
}

/// A counter whose record the writer keeps: its state is read when the
/// record is written.
pub trait Record: Send + Sync {
    fn saved(&self) -> Saved;
}

/// The cfg whose reports are written: at each tick (`now`, the last one
/// at `last`), the report that is due, as its file name and text, if
/// any. A tick also starts again the counters whose period has ended.
pub trait Reports: Send + Sync {
    fn tick(&self, last: i64, now: i64) -> Option<(String, String)>;
}

/// The `counter` file.
#[derive(Debug)]
pub struct CounterFile {
    file: File,
    path: String,
    /// The header's time of the last update when the file was opened
    /// (0 for a new file).
    updated: i64,
}

const HEADER_LEN: u64 = 16;
const RECORD_LEN: u64 = 24;
const SIGNATURE: &[u8; 4] = b"3CF\0";
/// 3proxy refuses times past this in a counter file (`MAX_COUNTER_TIME`).
const MAX_TIME: i64 = 1 << 40;

impl CounterFile {
    /// Open or create the file and check its header (`counter FILE`). A
    /// new file gets 3proxy's mode, 0660 before the umask, and `owner`.
    pub fn open(path: &str, owner: crate::sys::process::Owner) -> Result<CounterFile, String> {
        let mut opts = std::fs::OpenOptions::new();
        opts.read(true).write(true);
        let file = crate::sys::process::open_or_create(&opts, path.as_ref(), 0o660, owner)
            .map_err(|e| format!("{}: {e}", quote(path)))?;
        let updated = Self::header(&file, path)?;
        Ok(CounterFile {
            file,
            path: path.to_string(),
            updated,
        })
    }

    /// `3proxy -t`: what [`CounterFile::open`] would refuse, found
    /// without creating or changing the file.
    pub fn check(path: &str) -> Result<(), String> {
        let p = std::path::Path::new(path);
        crate::sys::process::check_writable(p).map_err(|e| format!("{}: {e}", quote(path)))?;
        match File::open(p) {
            Ok(file) => Self::header(&file, path).map(|_| ()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("{}: {e}", quote(path))),
        }
    }

    /// The time of the last update from the header (0 for an empty
    /// file), or why the file is not a counter file.
    fn header(file: &File, path: &str) -> Result<i64, String> {
        let mut h = [0u8; HEADER_LEN as usize];
        if file.read_exact_at(&mut h, 0).is_err() {
            return Ok(0);
        }
        if &h[..4] != SIGNATURE {
            return Err(format!("{}: not a counter file", quote(path)));
        }
        let t = i64::from_ne_bytes(h[8..16].try_into().unwrap_or_default());
        if !(0..MAX_TIME).contains(&t) {
            return Err(format!(
                "{}: invalid or corrupted counter file",
                quote(path)
            ));
        }
        Ok(t)
    }

    /// Record `number` (None past the end of the file), or why it is
    /// not a record.
    pub fn read(&self, number: u32) -> Result<Option<Saved>, String> {
        let mut r = [0u8; RECORD_LEN as usize];
        if self
            .file
            .read_exact_at(&mut r, Self::offset(number))
            .is_err()
        {
            return Ok(None);
        }
        let word = |i: usize| <[u8; 8]>::try_from(&r[i..i + 8]).unwrap_or_default();
        let st = Saved {
            traf: u64::from_ne_bytes(word(0)),
            cleared: i64::from_ne_bytes(word(8)),
            updated: i64::from_ne_bytes(word(16)),
        };
        if !(0..MAX_TIME).contains(&st.cleared) || !(0..MAX_TIME).contains(&st.updated) {
            return Err(format!(
                "{}: record {number} is invalid or corrupted",
                quote(&self.path)
            ));
        }
        Ok(Some(st))
    }

    fn write(&self, number: u32, st: Saved, now: i64) -> std::io::Result<()> {
        let mut h = [0u8; HEADER_LEN as usize];
        h[..4].copy_from_slice(SIGNATURE);
        h[8..].copy_from_slice(&now.to_ne_bytes());
        self.file.write_all_at(&h, 0)?;
        let mut r = [0u8; RECORD_LEN as usize];
        r[..8].copy_from_slice(&st.traf.to_ne_bytes());
        r[8..16].copy_from_slice(&st.cleared.to_ne_bytes());
        r[16..].copy_from_slice(&st.updated.to_ne_bytes());
        self.file.write_all_at(&r, Self::offset(number))
    }

    /// The header's time of the last update when the file was opened (0
    /// for a new file): where a new process's reports go on from.
    pub fn updated(&self) -> i64 {
        self.updated
    }

    fn offset(number: u32) -> u64 {
        HEADER_LEN + u64::from(number.saturating_sub(1)) * RECORD_LEN
    }
}

/// Unix seconds, on the clock of the log rotation (which a test may move
/// forward, see `log::clock`): counter periods and reports follow it.
fn unix_now() -> i64 {
    crate::log::clock()
}

/// Record `number` of `f` changed: it is written, with `c`'s state then,
/// within a second (by the writer thread, started at the first mark).
pub fn mark(f: &Arc<CounterFile>, number: u32, c: Arc<dyn Record>) {
    dumper().mark(f, number, c);
}

/// A counter whose record must be written, and its file. The state is read
/// when the record is written, not when it was marked: two sessions that
/// end at once may mark in the other order than they added, and the
/// older state written last would lose the other's bytes.
type Dirty = (Arc<CounterFile>, Arc<dyn Record>);

/// Writes changed counter records to the counter file, at most once a
/// second, on a thread of its own: a crash loses at most the last second.
struct Dumper {
    /// Records to write, by (file, record number): each written with its
    /// counter's state at the time of writing.
    dirty: Mutex<HashMap<(usize, u32), Dirty>>,
    started: AtomicBool,
    /// Writing has failed and not succeeded since.
    failing: AtomicBool,
}

fn dumper() -> &'static Dumper {
    static D: OnceLock<Dumper> = OnceLock::new();
    D.get_or_init(|| Dumper {
        dirty: Mutex::default(),
        started: AtomicBool::new(false),
        failing: AtomicBool::new(false),
    })
}

/// Write every changed counter record now (at exit; sessions still open
/// count what they moved so far only when they end).
pub fn flush() {
    dumper().flush();
}

/// How often changed counters reach the counter file.
const DUMP_EVERY: Duration = Duration::from_secs(1);

impl Dumper {
    fn mark(&'static self, f: &Arc<CounterFile>, number: u32, c: Arc<dyn Record>) {
        let key = (Arc::as_ptr(f) as usize, number);
        self.dirty
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (f.clone(), c));
        if !self.started.swap(true, Ordering::AcqRel) {
            let spawned = std::thread::Builder::new()
                .name("counters".into())
                .spawn(move || loop {
                    std::thread::sleep(DUMP_EVERY);
                    self.flush();
                });
            if let Err(e) = spawned {
                log::error!("cannot start the counter writer: {e}; writing now");
                self.started.store(false, Ordering::Release);
                self.flush();
            }
        }
    }

    /// Write what changed. A record that cannot be written (a full disk,
    /// a read-only file system) stays marked and is tried again at the
    /// next flush, unless a newer state of it came meanwhile; the failure
    /// is reported once when it starts, and once when the file is written
    /// again.
    fn flush(&self) {
        let batch = std::mem::take(&mut *self.dirty.lock().unwrap_or_else(|e| e.into_inner()));
        let now = unix_now();
        let mut failed = Vec::new();
        let mut wrote = None;
        for (key, (f, c)) in batch {
            match f.write(key.1, c.saved(), now) {
                Ok(()) => wrote = Some(f),
                Err(e) => {
                    if !self.failing.swap(true, Ordering::AcqRel) {
                        log::error!("counter file {}: {e}; trying again every second", f.path);
                    }
                    failed.push((key, (f, c)));
                }
            }
        }
        if failed.is_empty() {
            if let Some(f) = wrote {
                if self.failing.swap(false, Ordering::AcqRel) {
                    log::warn!("counter file {}: written again", f.path);
                }
            }
            return;
        }
        let mut dirty = self.dirty.lock().unwrap_or_else(|e| e.into_inner());
        for (key, v) in failed {
            dirty.entry(key).or_insert(v);
        }
    }
}

/// Writes the `counter` reports its [`Reports`] say are due, once a
/// second, for the cfg that last named a report.
struct Reporter {
    state: Mutex<ReportState>,
    started: AtomicBool,
}

struct ReportState {
    source: Option<Weak<dyn Reports>>,
    /// The last tick (3proxy's counter header time): a report is due when
    /// now is in another period than this.
    last: i64,
}

fn reporter() -> &'static Reporter {
    static R: OnceLock<Reporter> = OnceLock::new();
    R.get_or_init(|| Reporter {
        state: Mutex::new(ReportState {
            source: None,
            last: 0,
        }),
        started: AtomicBool::new(false),
    })
}

/// Make `source` the cfg whose reports are written, starting the report
/// thread if need be; `since` is the counter file's last update (0 for
/// none), where a new process goes on from.
pub fn start_reports(source: Weak<dyn Reports>, since: i64) {
    let r = reporter();
    {
        let mut st = r.state.lock().unwrap_or_else(|e| e.into_inner());
        st.source = Some(source);
        if st.last == 0 {
            st.last = since;
            if st.last == 0 {
                st.last = unix_now();
            }
        }
    }
    if !r.started.swap(true, Ordering::AcqRel) {
        let spawned = std::thread::Builder::new()
            .name("reports".into())
            .spawn(|| loop {
                std::thread::sleep(Duration::from_secs(1));
                reporter().tick(unix_now());
            });
        if let Err(e) = spawned {
            log::error!("cannot start the counter report writer: {e}");
            r.started.store(false, Ordering::Release);
        }
    }
}

impl Reporter {
    fn tick(&self, now: i64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(source) = st.source.as_ref().and_then(Weak::upgrade) else {
            return;
        };
        if let Some((path, text)) = source.tick(st.last, now) {
            if let Err(e) = std::fs::write(&path, text) {
                log::error!("counter report {path}: {e}");
            }
        }
        st.last = now;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A scratch directory of the test `name`, and the path of a counter
    /// file in it that is not there yet.
    pub(crate) fn scratch(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("threeproxy-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("counters");
        let _ = std::fs::remove_file(&path);
        (dir, path)
    }

    #[test]
    fn counter_file_round_trip() {
        let (dir, path) = scratch("limit");
        let p = path.to_str().unwrap();
        let f = CounterFile::open(p, Default::default()).unwrap();
        let st = Saved {
            traf: 12345,
            cleared: 1_700_000_000,
            updated: 1_700_000_100,
        };
        f.write(3, st, 1_700_000_200).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, HEADER_LEN + 3 * RECORD_LEN);
        assert_eq!(&bytes[..4], b"3CF\0");
        let f = CounterFile::open(p, Default::default()).unwrap();
        assert_eq!(f.read(3).unwrap(), Some(st));
        assert_eq!(
            f.read(1).unwrap(),
            Some(Saved::default()),
            "a hole reads as zeros"
        );
        assert_eq!(f.read(9).unwrap(), None);
        std::fs::write(&path, b"not a counter file").unwrap();
        assert!(CounterFile::open(p, Default::default())
            .unwrap_err()
            .contains("not a counter file"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_due_report_is_written_and_the_ticks_go_on() {
        /// A cfg whose report is due at every tick after the first.
        struct Every(String, Mutex<Vec<(i64, i64)>>);
        impl Reports for Every {
            fn tick(&self, last: i64, now: i64) -> Option<(String, String)> {
                self.1.lock().unwrap().push((last, now));
                (last > 1).then(|| (self.0.clone(), format!("{last} {now}\n")))
            }
        }
        let (dir, _) = scratch("reports");
        let path = dir.join("rep").to_str().unwrap().to_string();
        let cfg = Arc::new(Every(path.clone(), Mutex::default()));
        let weak: Weak<Every> = Arc::downgrade(&cfg);
        let source: Weak<dyn Reports> = weak;
        let r = Reporter {
            state: Mutex::new(ReportState {
                source: Some(source),
                last: 1,
            }),
            started: AtomicBool::new(true),
        };
        r.tick(5);
        assert!(!std::path::Path::new(&path).exists());
        r.tick(9);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "5 9\n");
        assert_eq!(*cfg.1.lock().unwrap(), [(1, 5), (5, 9)]);
        // A cfg that is gone is not asked.
        drop(cfg);
        r.tick(12);
        assert_eq!(r.state.lock().unwrap().last, 9);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
