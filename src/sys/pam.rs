//! Password checks through the system's PAM (3proxy's PamAuth plugin),
//! with libpam loaded at run time: the build needs no PAM headers or
//! development package, and a machine without libpam only fails when a
//! cfg asks for `pamauth`.
//!
//! One check runs at a time, as in 3proxy (PAM modules are not all safe
//! to call from several threads at once), on a thread of its own with a
//! full-size stack; a client waits for its answer with a time limit.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::Duration;

/// The library's name in every Linux distribution (the ABI since 1999).
const LIBPAM: &CStr = c"libpam.so.0";

const PAM_SUCCESS: c_int = 0;
const PAM_CONV_ERR: c_int = 19;
const PAM_PROMPT_ECHO_OFF: c_int = 1;
const PAM_PROMPT_ECHO_ON: c_int = 2;

/// Linux-PAM's `struct pam_message`.
#[repr(C)]
struct Message {
    style: c_int,
    text: *const c_char,
}

/// Linux-PAM's `struct pam_response`; PAM frees `resp` and the array with
/// free(), so both come from malloc.
#[repr(C)]
struct Response {
    resp: *mut c_char,
    retcode: c_int,
}

type ConvFn = extern "C" fn(c_int, *mut *const Message, *mut *mut Response, *mut c_void) -> c_int;

/// Linux-PAM's `struct pam_conv`.
#[repr(C)]
struct Conv {
    conv: ConvFn,
    appdata: *mut c_void,
}

type StartFn =
    unsafe extern "C" fn(*const c_char, *const c_char, *const Conv, *mut *mut c_void) -> c_int;
type StepFn = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;

/// The four entry points we call, resolved once.
struct Lib {
    start: StartFn,
    authenticate: StepFn,
    acct_mgmt: StepFn,
    end: StepFn,
}

static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

fn load() -> Result<Lib, String> {
    let lib = super::dl::Library::open(&[LIBPAM], "libpam")
        .map_err(|why| format!("cannot load {}: {why}", LIBPAM.to_string_lossy()))?;
    let sym = |name: &CStr| lib.sym(name);
    let (s, a, m, e) = (
        sym(c"pam_start")?,
        sym(c"pam_authenticate")?,
        sym(c"pam_acct_mgmt")?,
        sym(c"pam_end")?,
    );
    // SAFETY: these are libpam's exported functions, whose C signatures
    // (pam_appl.h, stable ABI) are exactly StartFn and StepFn.
    unsafe {
        Ok(Lib {
            start: std::mem::transmute::<*mut c_void, StartFn>(s),
            authenticate: std::mem::transmute::<*mut c_void, StepFn>(a),
            acct_mgmt: std::mem::transmute::<*mut c_void, StepFn>(m),
            end: std::mem::transmute::<*mut c_void, StepFn>(e),
        })
    }
}

fn lib() -> Result<&'static Lib, String> {
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Whether libpam can be used here (loaded on the first call): the cfg
/// asks this when it reads the PamAuth plugin line.
pub fn available() -> Result<(), String> {
    lib().map(|_| ())
}

/// What the conversation answers with: the password for a hidden prompt,
/// the user name for a visible one.
struct Answers {
    user: CString,
    password: CString,
}

/// The conversation function PAM calls for the prompts of its modules.
/// Never panics (it runs inside a C call).
extern "C" fn converse(
    n: c_int,
    msgs: *mut *const Message,
    out: *mut *mut Response,
    appdata: *mut c_void,
) -> c_int {
    if n <= 0 || n > 32 || msgs.is_null() || out.is_null() || appdata.is_null() {
        return PAM_CONV_ERR;
    }
    let n = n as usize;
    // SAFETY: `appdata` is the `&Answers` that `check` put in the Conv; it
    // outlives the pam_* calls that can call us.
    let answers = unsafe { &*(appdata as *const Answers) };
    // SAFETY: calloc of n responses; zeroed bytes are valid (NULL, 0).
    let resp = unsafe { libc::calloc(n, std::mem::size_of::<Response>()) } as *mut Response;
    if resp.is_null() {
        return PAM_CONV_ERR;
    }
    for i in 0..n {
        // SAFETY: Linux-PAM passes an array of `n` pointers to messages,
        // each valid for the duration of this call.
        let m = unsafe { *msgs.add(i) };
        if m.is_null() {
            continue;
        }
        // SAFETY: a non-NULL message pointer from PAM (see above).
        let style = unsafe { (*m).style };
        let text = match style {
            PAM_PROMPT_ECHO_OFF => Some(&answers.password),
            PAM_PROMPT_ECHO_ON => Some(&answers.user),
            _ => None,
        };
        if let Some(t) = text {
            // SAFETY: strdup of a valid C string; the copy is PAM's to free.
            let copy = unsafe { libc::strdup(t.as_ptr()) };
            if copy.is_null() {
                for j in 0..i {
                    // SAFETY: entries before i are NULL or our strdup copies.
                    unsafe { libc::free((*resp.add(j)).resp.cast()) };
                }
                // SAFETY: our calloc'ed array, not yet handed to PAM.
                unsafe { libc::free(resp.cast()) };
                return PAM_CONV_ERR;
            }
            // SAFETY: i < n, inside the calloc'ed array.
            unsafe { (*resp.add(i)).resp = copy };
        }
    }
    // SAFETY: `out` is PAM's non-NULL place for the answer array.
    unsafe { *out = resp };
    PAM_SUCCESS
}

/// Why a PAM check did not let the user in.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// PAM said no (wrong password, unknown user, expired account...).
    Denied,
    /// PAM could not be asked (libpam did not load).
    Unavailable(String),
    /// No answer in the time allowed.
    TimedOut,
}

/// Stack of the thread that runs the checks: PAM modules (and the hash
/// functions they call) are written for a process's main stack, far more
/// than a client thread has.
const WORKER_STACK: usize = 1 << 20;

/// One check for the worker thread.
struct Job {
    service: CString,
    answers: Answers,
    reply: mpsc::Sender<Result<(), Refused>>,
}

/// The queue of the thread that runs the checks, one at a time (started
/// on the first check).
fn worker() -> Result<&'static Mutex<mpsc::Sender<Job>>, Refused> {
    static QUEUE: OnceLock<Result<Mutex<mpsc::Sender<Job>>, String>> = OnceLock::new();
    let q = QUEUE.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("pam".into())
            .stack_size(WORKER_STACK)
            .spawn(move || {
                for job in rx {
                    let _ = job.reply.send(run(&job.service, &job.answers));
                }
            })
            .map(|_| Mutex::new(tx))
            .map_err(|e| format!("cannot start the PAM thread: {e}"))
    });
    q.as_ref().map_err(|e| Refused::Unavailable(e.clone()))
}

/// Check `user`/`password` with PAM service `service`: pam_authenticate,
/// then pam_acct_mgmt, as 3proxy's PamAuth does. The check runs on the
/// PAM thread; an answer that takes longer than `wait` counts as a
/// refusal (the check itself goes on there and holds up those after it).
pub fn check(service: &str, user: &str, password: &str, wait: Duration) -> Result<(), Refused> {
    lib().map_err(Refused::Unavailable)?;
    // A NUL byte cannot reach PAM: no such login can be right.
    let nul = |_| Refused::Denied;
    let (reply, answer) = mpsc::channel();
    let job = Job {
        service: CString::new(service).map_err(nul)?,
        answers: Answers {
            user: CString::new(user).map_err(nul)?,
            password: CString::new(password).map_err(nul)?,
        },
        reply,
    };
    let queue = worker()?;
    let sent = queue
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send(job)
        .is_ok();
    if !sent {
        return Err(Refused::Unavailable("the PAM thread has stopped".into()));
    }
    answer.recv_timeout(wait).unwrap_or(Err(Refused::TimedOut))
}

/// One check, on the PAM thread.
fn run(svc: &CStr, answers: &Answers) -> Result<(), Refused> {
    let lib = lib().map_err(Refused::Unavailable)?;
    let conv = Conv {
        conv: converse,
        appdata: (answers as *const Answers).cast_mut().cast(),
    };
    let mut h: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid C strings and a Conv that outlive the handle (pam_end
    // below, before they drop); `h` receives the handle.
    let mut rc = unsafe { (lib.start)(svc.as_ptr(), answers.user.as_ptr(), &conv, &mut h) };
    if rc == PAM_SUCCESS {
        // SAFETY: `h` is the live handle pam_start made.
        rc = unsafe { (lib.authenticate)(h, 0) };
    }
    if rc == PAM_SUCCESS {
        // SAFETY: as above.
        rc = unsafe { (lib.acct_mgmt)(h, 0) };
    }
    if !h.is_null() {
        // SAFETY: ends the handle pam_start made; not used after.
        unsafe { (lib.end)(h, rc) };
    }
    if rc == PAM_SUCCESS {
        Ok(())
    } else {
        Err(Refused::Denied)
    }
}
