//! A system library loaded at run time (libpam for `auth pam`, libldap
//! for `auth ldap`), so the build needs neither: dlopen the first of its
//! names that loads, and look its functions up. The handle is never
//! closed, so what is taken from it stays valid for the process's life.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr};

/// The last dl* error of this thread, as text.
fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by
    // libc, valid until the next dl* call on this thread; we copy it now.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".to_string()
    } else {
        // SAFETY: non-NULL, NUL-terminated (see above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// A loaded library: `what` names it in messages (`libpam`).
pub(super) struct Library {
    handle: *mut c_void,
    what: &'static str,
}

impl Library {
    /// Load the first of `names` that loads; Err says why the last failed.
    pub(super) fn open(names: &[&CStr], what: &'static str) -> Result<Library, String> {
        let mut why = String::from("no name to load");
        for name in names {
            // SAFETY: dlopen with a valid C string; the handle is never
            // closed (see the module's note).
            let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if !h.is_null() {
                return Ok(Library { handle: h, what });
            }
            why = dlerror();
        }
        Err(why)
    }

    /// The address of the function `name`: the caller transmutes it to
    /// the function's C signature, which it must know exactly.
    pub(super) fn sym(&self, name: &CStr) -> Result<*mut c_void, String> {
        // SAFETY: `handle` is a live handle and `name` a valid C string.
        let p = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        if p.is_null() {
            Err(format!(
                "{} in {}: {}",
                name.to_string_lossy(),
                self.what,
                dlerror()
            ))
        } else {
            Ok(p)
        }
    }
}
