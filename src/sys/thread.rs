//! Client threads on stacks this module maps and unmaps itself
//! (pthread_create with pthread_attr_setstack), so that the stack of a
//! thread that has exited holds no memory.
//!
//! std::thread leaves the stacks to glibc, which keeps the stacks of
//! exited threads in a cache (up to 40 MB of them) for the next threads,
//! with the pages their last frames, thread descriptor and TLS used still
//! resident: 8-12 KB each. A burst of 2,000 clients that park in the
//! parking lot leaves up to 700 such stacks (issue 19: about 3 KB of RSS
//! per idle client). Here the stack of a thread that has ended goes back
//! to a small pool of mappings whose pages are discarded (no RSS), and
//! beyond the pool it is unmapped.
//!
//! A stack can be reused only once its thread is gone, which only
//! pthread_join knows: a thread's last act is to hand its own handle and
//! stack to the reaper, one thread of the process that joins it (a few
//! microseconds later: the thread is then returning) and only then
//! discards the pages.
#![allow(unsafe_code)]

use std::ffi::{c_void, CString};
use std::io;
use std::sync::{Condvar, Mutex, OnceLock};

/// Discarded stacks kept mapped for the next threads; more are unmapped.
const POOL_MAX: usize = 64;

/// One mapping: a guard page (no access) and the stack above it.
struct Stack {
    map: usize,
    len: usize,
}

fn page() -> usize {
    // SAFETY: sysconf only reads a system constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

impl Stack {
    fn new(size: usize) -> io::Result<Stack> {
        let page = page();
        let len = size + page;
        // SAFETY: a fresh anonymous private mapping at an address the
        // kernel picks; nothing else refers to it. The result is checked.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Stack {
            map: map as usize,
            len,
        };
        // SAFETY: the first page of the mapping made above, which nothing
        // uses: it becomes the guard that a stack overflow faults on.
        if unsafe { libc::mprotect(map, page, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error()); // the drop unmaps it
        }
        Ok(stack)
    }

    /// The usable stack: everything above the guard page.
    fn base(&self) -> usize {
        self.map + page()
    }

    fn size(&self) -> usize {
        self.len - page()
    }

    /// Give the stack's pages back to the system; they read as zeros
    /// when the next thread touches them.
    fn discard(&self) {
        // SAFETY: the stack belongs to no thread (its thread has been
        // joined, or never started): no frame, descriptor or TLS lives in
        // it, so discarding its contents changes nothing anyone can see.
        unsafe {
            libc::madvise(self.base() as *mut c_void, self.size(), libc::MADV_DONTNEED);
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours alone and no thread runs on it (the
        // same condition as `discard`); it is unmapped once, here.
        unsafe {
            libc::munmap(self.map as *mut c_void, self.len);
        }
    }
}

static POOL: Mutex<Vec<Stack>> = Mutex::new(Vec::new());

/// A stack of `size` bytes, from the pool or newly mapped.
fn take(size: usize) -> io::Result<Stack> {
    {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = pool.iter().position(|s| s.size() == size) {
            return Ok(pool.swap_remove(i));
        }
    }
    Stack::new(size)
}

/// A stack whose thread is gone (or never started): into the pool with
/// its pages discarded, or unmapped if the pool is full.
fn give_back(stack: Stack) {
    // Outside the lock: `take`, on the way to a new thread, waits for it.
    stack.discard();
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if pool.len() < POOL_MAX {
        pool.push(stack);
    }
    // Dropped here otherwise, which unmaps it.
}

/// Threads that have ended their work and the stacks they ran on.
struct Reaper {
    queue: Mutex<Vec<(libc::pthread_t, Stack)>>,
    wake: Condvar,
}

static REAPER: Reaper = Reaper {
    queue: Mutex::new(Vec::new()),
    wake: Condvar::new(),
};
/// Whether the reaper thread started (it is started once, by the first
/// `spawn`).
static REAPER_RUNS: OnceLock<bool> = OnceLock::new();

fn start_reaper() -> io::Result<()> {
    let runs = REAPER_RUNS.get_or_init(|| {
        std::thread::Builder::new()
            .name("reaper".into())
            .stack_size(64 << 10)
            .spawn(reap)
            .is_ok()
    });
    if *runs {
        Ok(())
    } else {
        Err(io::Error::other(
            "the thread that reclaims client thread stacks could not start",
        ))
    }
}

fn reap() {
    loop {
        let batch = {
            let mut q = REAPER.queue.lock().unwrap_or_else(|e| e.into_inner());
            while q.is_empty() {
                q = REAPER.wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            std::mem::take(&mut *q)
        };
        for (thread, stack) in batch {
            // SAFETY: `thread` was created joinable by `spawn` and queued
            // once, by itself, as its last act; it is joined here only.
            // The join returns once the thread has exited, so its stack
            // is free for reuse after it.
            unsafe {
                libc::pthread_join(thread, std::ptr::null_mut());
            }
            give_back(stack);
        }
    }
}

struct Start {
    work: Box<dyn FnOnce() + Send>,
    name: Option<CString>,
    stack: Stack,
}

extern "C" fn thread_main(arg: *mut c_void) -> *mut c_void {
    // SAFETY: `arg` is the Box<Start> that `spawn` leaked for this thread
    // and gave to no one else.
    let start = unsafe { Box::from_raw(arg as *mut Start) };
    let Start { work, name, stack } = *start;
    if let Some(name) = &name {
        // SAFETY: names this thread with a NUL-terminated string of at
        // most 15 bytes, which the call copies.
        unsafe {
            libc::pthread_setname_np(libc::pthread_self(), name.as_ptr());
        }
    }
    // A panic ends the thread, as with std::thread (the panic hook has
    // printed it); it must not unwind out of this C function.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() };
    REAPER
        .queue
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((me, stack));
    REAPER.wake.notify_one();
    std::ptr::null_mut()
}

/// Run `work` on a new thread named `name` (cut to 15 bytes) with a stack
/// of `stack_size` bytes (rounded up to pages, at least 32 KiB). On
/// failure `work` is dropped unrun.
pub fn spawn(
    name: &str,
    stack_size: usize,
    work: impl FnOnce() + Send + 'static,
) -> io::Result<()> {
    start_reaper()?;
    let page = page();
    let size = stack_size.max(32 << 10).next_multiple_of(page);
    let stack = take(size)?;
    let (base, size) = (stack.base(), stack.size());
    let cut = &name.as_bytes()[..name.len().min(15)];
    let start = Box::new(Start {
        work: Box::new(work),
        name: CString::new(cut).ok(),
        stack,
    });
    let arg = Box::into_raw(start);
    // SAFETY: `attr` is initialised before use and destroyed once. The
    // stack given to the thread is a mapping of ours that nothing else
    // uses until the reaper has joined the thread. `arg` goes to the new
    // thread, which takes it back as a Box; if the thread is not created
    // it is taken back here instead, exactly once either way.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        let mut rc = libc::pthread_attr_init(&mut attr);
        if rc == 0 {
            rc = libc::pthread_attr_setstack(&mut attr, base as *mut c_void, size);
            if rc == 0 {
                let mut thread: libc::pthread_t = 0;
                rc = libc::pthread_create(&mut thread, &attr, thread_main, arg as *mut c_void);
            }
            libc::pthread_attr_destroy(&mut attr);
        }
        if rc != 0 {
            let start = Box::from_raw(arg);
            let Start { work, stack, .. } = *start;
            give_back(stack);
            drop(work);
            return Err(io::Error::from_raw_os_error(rc));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Where this thread's stack pointer is.
    fn sp() -> usize {
        let marker = 0u8;
        std::hint::black_box(&marker) as *const u8 as usize
    }

    #[test]
    fn a_thread_runs_named_and_the_next_one_reuses_its_stack() {
        // A size no other test uses: the pool holds one stack of it.
        const SIZE: usize = 52 << 10;
        let (tx, rx) = mpsc::channel();
        let t = tx.clone();
        spawn("a-name-longer-than-fifteen", SIZE, move || {
            let mut buf = [0u8; 32];
            // SAFETY (test): reads this thread's name into a buffer of
            // the length the call is given.
            unsafe {
                libc::pthread_getname_np(libc::pthread_self(), buf.as_mut_ptr().cast(), buf.len());
            }
            let name = String::from_utf8_lossy(&buf)
                .trim_end_matches('\0')
                .to_string();
            t.send((name, sp())).unwrap();
        })
        .unwrap();
        let (name, sp1) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(name, "a-name-longer-t");
        // Back in the pool once the reaper has joined the thread, with
        // its pages discarded.
        let in_pool = || {
            POOL.lock()
                .unwrap()
                .iter()
                .any(|s| s.base() <= sp1 && sp1 < s.base() + s.size())
        };
        let mut back = false;
        for _ in 0..400 {
            if in_pool() {
                back = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            back,
            "the stack of the ended thread did not come back to the pool"
        );
        let mut resident = [0u8; 16];
        let base = POOL
            .lock()
            .unwrap()
            .iter()
            .find(|s| s.base() <= sp1 && sp1 < s.base() + s.size())
            .map(|s| s.base())
            .unwrap();
        // SAFETY (test): mincore fills one byte per page of a range of a
        // mapping of ours; `resident` has room for SIZE / 4 KiB pages.
        let rc = unsafe { libc::mincore(base as *mut c_void, SIZE, resident.as_mut_ptr()) };
        assert_eq!(rc, 0);
        let kept = resident[..SIZE / 4096]
            .iter()
            .filter(|b| *b & 1 != 0)
            .count();
        assert_eq!(kept, 0, "pages of a discarded stack are still resident");
        // The next thread of that size runs on it.
        spawn("second", SIZE, move || {
            tx.send((String::new(), sp())).unwrap()
        })
        .unwrap();
        let (_, sp2) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(
            base <= sp2 && sp2 < base + SIZE,
            "the second thread did not run on the pooled stack"
        );
    }

    #[test]
    fn a_panic_ends_its_thread_and_not_the_process() {
        let (tx, rx) = mpsc::channel::<u32>();
        spawn("panics", 48 << 10, move || {
            let _keep = tx;
            panic!("on purpose");
        })
        .unwrap();
        // The sender was dropped by the unwinding: the channel closes.
        assert!(rx.recv_timeout(Duration::from_secs(5)).is_err());
        // Had the panic unwound out of the thread's C entry point, the
        // process would have aborted before this.
        let (tx, rx) = mpsc::channel();
        spawn("after", 48 << 10, move || tx.send(7u32).unwrap()).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 7);
    }
}
