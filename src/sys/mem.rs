//! Keeping the heap small for a thread-per-connection server (glibc malloc
//! tuning, which std does not expose).
//!
//! glibc gives threads separate arenas (up to 8 per core), and memory freed
//! inside an arena stays resident until the arena's top is free. With
//! thousands of client threads that each borrow and free 64 KiB relay
//! buffers, that turns into tens of MB that are free but never returned.
//! So: few arenas (the hot paths allocate almost nothing, so contention is
//! low), and a trim once a second after big buffers were freed.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};

static FREED: AtomicBool = AtomicBool::new(false);

/// Called once at start, before any other thread exists.
pub fn tune() {
    // SAFETY: mallopt only sets malloc parameters; it is called before any
    // other thread runs, with constant arguments glibc documents.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// A big buffer was freed instead of being kept for reuse.
pub fn freed_big() {
    FREED.store(true, Ordering::Relaxed);
}

/// Give free heap pages back to the system if big buffers were freed since
/// the last call (the main thread calls this once a second).
pub fn trim() {
    if FREED.swap(false, Ordering::Relaxed) {
        // SAFETY: malloc_trim takes the malloc locks itself and only
        // releases pages that hold no live allocation.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// Give back the pages of this thread's stack below the caller's frame
/// (deeper than it): a deep call that has returned (the TLS handshake)
/// leaves them resident, and a parked or idle client thread would keep
/// them for nothing. They read as zeros if touched again.
///
/// Never inlined, so that everything of the caller's is above `marker`:
/// below it there is only this function's own frame (a few hundred
/// bytes) and those of the calls it makes.
#[inline(never)]
pub fn release_stack_below_here() {
    let marker = 0u8;
    let sp = std::hint::black_box(&marker) as *const u8 as usize;
    // A margin under `marker` for this frame's other locals and the
    // calls below (the madvise wrapper's return address is there while
    // the kernel discards). 1 KiB, not a page: the page the margin ends
    // in stays, and every page kept costs 4 KiB per idle thread.
    const MARGIN: usize = 1024;
    let page = 4096usize;
    let (mut addr, mut size, mut guard) = (std::ptr::null_mut(), 0usize, 0usize);
    // SAFETY: `attr` is initialised by pthread_getattr_np before it is
    // read and destroyed once; the calls only report this thread's stack
    // bounds. madvise(MADV_DONTNEED) is applied to whole pages strictly
    // below the current stack pointer minus a margin, inside this
    // thread's own stack and above its guard: no live frame is there
    // (nothing of the thread lives below its stack pointer, and a signal
    // handler cannot run on this thread while the call is in progress),
    // so discarding their contents changes nothing the program can see.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return;
        }
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0
            && libc::pthread_attr_getguardsize(&attr, &mut guard) == 0;
        libc::pthread_attr_destroy(&mut attr);
        if !ok {
            return;
        }
        let low = (addr as usize + guard).next_multiple_of(page);
        let high = sp.saturating_sub(MARGIN) / page * page;
        if high > low && sp < addr as usize + size {
            libc::madvise(low as *mut libc::c_void, high - low, libc::MADV_DONTNEED);
        }
    }
}
