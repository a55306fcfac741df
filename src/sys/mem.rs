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
