//! Waiting for a blocked signal with a time limit (sigtimedwait), which nix
//! does not wrap: the main thread takes signals this way and still wakes up
//! once a second for its periodic duties (`monitor`).
#![allow(unsafe_code)]

use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};

/// Wait up to `t` for one of the (blocked) signals in `set`. None when the
/// time ran out or the wait was interrupted.
pub fn wait_timeout(set: &SigSet, t: Duration) -> Option<Signal> {
    let ts = libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `set` is a valid, initialised sigset_t borrowed for the call;
    // a null siginfo pointer is allowed; `ts` lives on our stack until the
    // call returns. sigtimedwait only reads these.
    let r = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &ts) };
    if r > 0 {
        Signal::try_from(r).ok()
    } else {
        None
    }
}
