//! `auth ldap` (3proxy's LdapPlugin): a login checked against an LDAP
//! directory through the system's OpenLDAP client library, loaded at run
//! time. The build needs no LDAP headers or development package, and a
//! machine without libldap only fails when a cfg loads the plugin. (The
//! Rust LDAP client crate runs on an async runtime, which the serving
//! path keeps out.)
//!
//! A check is what the plugin's `ldapfunc` does: bind as the user (the DN
//! `ATTR=NAME,USERENV`) with the password; then, on a new connection,
//! bind with `ldapconnect`'s DN and password and search `ldapsbase`'s
//! subtree for `(&(ATTR=NAME)(GROUPATTR=ACCESS))`; one entry or more lets
//! the user in. Each check runs on a thread of its own with a full-size
//! stack (libldap, its TLS and the resolver it calls are written for far
//! more stack than a client thread has); every network wait of libldap
//! has the cfg's time limit (LDAP_OPT_NETWORK_TIMEOUT for the connect,
//! LDAP_OPT_TIMEOUT for each operation), and the client waits for the
//! answer no longer than the steps together may take.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, CString};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

/// Debian's OpenLDAP 2.5 client library, then the older and newer sonames.
const LIBLDAP: &[&CStr] = &[c"libldap-2.5.so.0", c"libldap.so.2", c"libldap-2.4.so.2"];

const LDAP_SUCCESS: c_int = 0;
const LDAP_SIZELIMIT_EXCEEDED: c_int = 4;
const LDAP_OPT_SUCCESS: c_int = 0;
const LDAP_OPT_REFERRALS: c_int = 0x0008;
const LDAP_OPT_PROTOCOL_VERSION: c_int = 0x0011;
const LDAP_OPT_TIMEOUT: c_int = 0x5002;
const LDAP_OPT_NETWORK_TIMEOUT: c_int = 0x5005;
const LDAP_VERSION3: c_int = 3;
const LDAP_SCOPE_SUBTREE: c_int = 2;

/// OpenLDAP's `struct berval`.
#[repr(C)]
struct Berval {
    len: c_ulong,
    val: *const c_char,
}

type InitializeFn = unsafe extern "C" fn(*mut *mut c_void, *const c_char) -> c_int;
type SetOptionFn = unsafe extern "C" fn(*mut c_void, c_int, *const c_void) -> c_int;
type BindFn = unsafe extern "C" fn(
    *mut c_void,
    *const c_char,
    *const c_char,
    *const Berval,
    *mut c_void,
    *mut c_void,
    *mut *mut Berval,
) -> c_int;
type SearchFn = unsafe extern "C" fn(
    *mut c_void,
    *const c_char,
    c_int,
    *const c_char,
    *const *const c_char,
    c_int,
    *mut c_void,
    *mut c_void,
    *const libc::timeval,
    c_int,
    *mut *mut c_void,
) -> c_int;
type CountFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
type MsgFreeFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type UnbindFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void) -> c_int;
type Err2StringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type EntryFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> *mut c_void;
type GetValuesFn =
    unsafe extern "C" fn(*mut c_void, *mut c_void, *const c_char) -> *mut *mut Berval;
type ValueFreeFn = unsafe extern "C" fn(*mut *mut Berval);

/// The entry points we call, resolved once.
struct Lib {
    initialize: InitializeFn,
    set_option: SetOptionFn,
    bind: BindFn,
    search: SearchFn,
    count: CountFn,
    msgfree: MsgFreeFn,
    unbind: UnbindFn,
    err2string: Err2StringFn,
    first_entry: EntryFn,
    next_entry: EntryFn,
    get_values: GetValuesFn,
    value_free: ValueFreeFn,
}

static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

fn load() -> Result<Lib, String> {
    let lib = super::dl::Library::open(LIBLDAP, "libldap").map_err(|why| {
        format!("cannot load the OpenLDAP client library (libldap-2.5.so.0): {why}")
    })?;
    let sym = |name: &CStr| lib.sym(name);
    let syms = [
        sym(c"ldap_initialize")?,
        sym(c"ldap_set_option")?,
        sym(c"ldap_sasl_bind_s")?,
        sym(c"ldap_search_ext_s")?,
        sym(c"ldap_count_entries")?,
        sym(c"ldap_msgfree")?,
        sym(c"ldap_unbind_ext_s")?,
        sym(c"ldap_err2string")?,
        sym(c"ldap_first_entry")?,
        sym(c"ldap_next_entry")?,
        sym(c"ldap_get_values_len")?,
        sym(c"ldap_value_free_len")?,
    ];
    // SAFETY: these are libldap's exported functions, whose C signatures
    // (ldap.h, the stable OpenLDAP 2 ABI) are exactly the types above.
    unsafe {
        Ok(Lib {
            initialize: std::mem::transmute::<*mut c_void, InitializeFn>(syms[0]),
            set_option: std::mem::transmute::<*mut c_void, SetOptionFn>(syms[1]),
            bind: std::mem::transmute::<*mut c_void, BindFn>(syms[2]),
            search: std::mem::transmute::<*mut c_void, SearchFn>(syms[3]),
            count: std::mem::transmute::<*mut c_void, CountFn>(syms[4]),
            msgfree: std::mem::transmute::<*mut c_void, MsgFreeFn>(syms[5]),
            unbind: std::mem::transmute::<*mut c_void, UnbindFn>(syms[6]),
            err2string: std::mem::transmute::<*mut c_void, Err2StringFn>(syms[7]),
            first_entry: std::mem::transmute::<*mut c_void, EntryFn>(syms[8]),
            next_entry: std::mem::transmute::<*mut c_void, EntryFn>(syms[9]),
            get_values: std::mem::transmute::<*mut c_void, GetValuesFn>(syms[10]),
            value_free: std::mem::transmute::<*mut c_void, ValueFreeFn>(syms[11]),
        })
    }
}

fn lib() -> Result<&'static Lib, String> {
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Whether libldap can be used here (loaded on the first call): the cfg
/// asks this when it reads the LdapPlugin line.
pub fn available() -> Result<(), String> {
    lib().map(|_| ())
}

/// `ldapconnect`'s server list as libldap's URI list: 3proxy hands its
/// text to `ldap_init(TEXT, 389)`, which takes host names or addresses,
/// space-separated, each with an optional `:PORT` (an IPv6 address in
/// brackets). Refused: anything else (a URL, a bracket left open).
pub fn server_uris(text: &str) -> Result<String, String> {
    let mut uris = Vec::new();
    for host in text.split_ascii_whitespace() {
        let bad = host.contains('/')
            || host.contains('?')
            || host.contains('@')
            || (host.starts_with('[') && !host.contains(']'));
        if bad {
            return Err(format!(
                "'{}' is not a host[:port] (ldapconnect takes host names or \
                 addresses, with an optional port, as 3proxy does)",
                crate::conf::token::quote(host)
            ));
        }
        uris.push(format!("ldap://{host}"));
    }
    if uris.is_empty() {
        return Err("no LDAP server given".into());
    }
    let uris = uris.join(" ");
    let lib = lib()?;
    let c = CString::new(uris.as_str()).map_err(|_| "a NUL byte in the server".to_string())?;
    let mut ld = std::ptr::null_mut();
    // SAFETY: a valid C string; `ld` receives a handle, freed below.
    let rc = unsafe { (lib.initialize)(&mut ld, c.as_ptr()) };
    if !ld.is_null() {
        // SAFETY: the handle ldap_initialize made, never used again.
        unsafe { (lib.unbind)(ld, std::ptr::null_mut(), std::ptr::null_mut()) };
    }
    if rc != LDAP_SUCCESS {
        return Err(format!(
            "libldap does not take '{}': {}",
            crate::conf::token::quote(text),
            err_text(lib, rc)
        ));
    }
    Ok(uris)
}

fn err_text(lib: &Lib, rc: c_int) -> String {
    // SAFETY: ldap_err2string returns a static NUL-terminated string for
    // any code (an "Unknown error" text for codes it does not know).
    let p = unsafe { (lib.err2string)(rc) };
    if p.is_null() {
        format!("LDAP error {rc}")
    } else {
        // SAFETY: non-NULL, static, NUL-terminated.
        let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
        format!("{s} ({rc})")
    }
}

/// The plugin's settings, complete (the cfg refuses `auth ldap` while
/// one is missing).
#[derive(Debug, Clone)]
pub struct Settings {
    /// `ldapconnect`'s servers, as URIs ([`server_uris`]).
    pub uris: String,
    /// `ldapconnect`'s DN and password, for the search.
    pub bind_dn: String,
    pub bind_pw: Option<String>,
    /// `ldapattr`: the user's attribute, the group attribute, and whether
    /// the user name is lowercased first.
    pub user_attr: String,
    pub group_attr: String,
    pub lowercase: bool,
    /// `ldapuserenv`: the DN the user's RDN is put in front of.
    pub userenv: String,
    /// `ldapsbase`: the base of the search.
    pub sbase: String,
    /// `ldapaccess`: the group attribute's value a user must have.
    pub access: String,
    /// Each connect and each operation's time limit (BYTE_LONG).
    pub timeout: Duration,
}

/// The settings every service shares, set once the cfg has loaded
/// (3proxy's plugin keeps them process-wide: the last line wins).
#[derive(Debug, Default)]
pub struct Slot(OnceLock<Arc<Settings>>);

impl Slot {
    pub fn set(&self, s: Settings) {
        let _ = self.0.set(Arc::new(s));
    }

    pub fn get(&self) -> Option<&Arc<Settings>> {
        self.0.get()
    }
}

/// Why a check did not let the user in, with 3proxy's code for it.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The name does not fit the plugin's 511-byte escaped buffer (5).
    NameTooLong,
    /// The search found no entry: not in the `ldapaccess` group (5).
    NotMember,
    /// The user's bind failed: a wrong password, an unknown DN, or no
    /// server answered (7).
    UserBind(String),
    /// `ldapconnect`'s bind failed (7).
    ServiceBind(String),
    /// The search failed (7; 3proxy's plugin ignores the error).
    Search(String),
    /// libldap could not be used, or no thread could run the check (7).
    Unavailable(String),
    /// No answer in the time the steps may take together (7).
    TimedOut,
}

impl Refused {
    /// The plugin's return code: 5 or 7.
    pub fn code(&self) -> u32 {
        match self {
            Refused::NameTooLong | Refused::NotMember => 5,
            _ => 7,
        }
    }
}

/// RFC 4514 escaping of an attribute value in a DN, as the plugin does
/// it (`,+"\<>;=`, control bytes and DEL as `\XX`). None when the result
/// would not fit the plugin's buffer (511 bytes).
pub fn escape_dn(s: &str) -> Option<String> {
    escape(s, |c| b",+\"\\<>;=".contains(&c) || c < 0x20 || c == 0x7f)
}

/// RFC 4515 escaping of a value in a search filter, as the plugin does
/// it (`*()\`, control bytes and every byte from 0x7f up as `\XX`).
pub fn escape_filter(s: &str) -> Option<String> {
    escape(s, |c| b"*()\\".contains(&c) || !(0x20..0x7f).contains(&c))
}

fn escape(s: &str, special: impl Fn(u8) -> bool) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    for &c in s.as_bytes() {
        if special(c) {
            out.extend_from_slice(format!("\\{c:02X}").as_bytes());
        } else {
            out.push(c);
        }
        if out.len() > 511 {
            return None;
        }
    }
    // Only ASCII bytes are replaced, by ASCII: what is left is UTF-8.
    String::from_utf8(out).ok()
}

/// The DN the user binds as, and the filter of the search.
pub fn user_dn_and_filter(s: &Settings, user: &str) -> Result<(String, String), Refused> {
    let dn_name = escape_dn(user).ok_or(Refused::NameTooLong)?;
    let f_name = escape_filter(user).ok_or(Refused::NameTooLong)?;
    let dn = format!("{}={},{}", s.user_attr, dn_name, s.userenv);
    let filter = format!(
        "(&({}={})({}={}))",
        s.user_attr, f_name, s.group_attr, s.access
    );
    Ok((dn, filter))
}

/// Stack of the thread a check runs on.
const WORKER_STACK: usize = 1 << 20;

/// Check `user` and `password`. The caller has lowercased the name when
/// `ldapattr` asks it and refused an empty password (code 4).
pub fn check(s: &Arc<Settings>, user: &str, password: &str) -> Result<(), Refused> {
    lib().map_err(Refused::Unavailable)?;
    let (dn, filter) = user_dn_and_filter(s, user)?;
    // A NUL byte cannot reach LDAP: no such login can be right.
    let nul = |_| Refused::UserBind("a NUL byte in the user name or password".into());
    let job = Job {
        s: s.clone(),
        dn: CString::new(dn).map_err(nul)?,
        password: password.as_bytes().to_vec(),
        filter: CString::new(filter).map_err(nul)?,
    };
    // Two connects and three operations at most, and a second of slack.
    let wait = s.timeout * 5 + Duration::from_secs(1);
    match on_worker(wait, move || run(&job)) {
        Ok(r) => r,
        Err(Worker::Timeout) => Err(Refused::TimedOut),
        Err(Worker::Spawn(e)) => Err(Refused::Unavailable(format!(
            "cannot start a thread for the check: {e}"
        ))),
    }
}

/// Why a job on a worker thread gave no answer.
enum Worker {
    Spawn(std::io::Error),
    Timeout,
}

/// Run `job` on a thread of its own with a full-size stack, and wait for
/// its answer no longer than `wait` (the thread, left behind, ends when
/// libldap's own time limits end its calls).
fn on_worker<T: Send + 'static>(
    wait: Duration,
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Worker> {
    let (reply, answer) = mpsc::channel();
    std::thread::Builder::new()
        .name("ldap".into())
        .stack_size(WORKER_STACK)
        .spawn(move || {
            let _ = reply.send(job());
        })
        .map_err(Worker::Spawn)?;
    answer.recv_timeout(wait).map_err(|_| Worker::Timeout)
}

/// `ldaptrafgroup`'s question, which the plugin asks while the cfg
/// loads: with `ldapconnect`'s DN and password, a search of the subtree
/// of `base` for `filter`.
#[derive(Debug, Clone)]
pub struct GroupSearch {
    pub uris: String,
    pub bind_dn: String,
    pub bind_pw: Option<String>,
    pub base: String,
    pub filter: String,
    /// The attribute whose first value names each member.
    pub attr: String,
    /// The connect's and each operation's time limit.
    pub timeout: Duration,
}

/// The first value of `q.attr` of each entry the search finds, in the
/// order of the directory's answer.
pub fn group_members(q: &GroupSearch) -> Result<Vec<Vec<u8>>, String> {
    lib()?;
    let uris = q.uris.clone();
    let q = q.clone();
    // One connect and two operations, and a second of slack.
    let wait = q.timeout * 3 + Duration::from_secs(1);
    match on_worker(wait, move || search_members(&q)) {
        Ok(r) => r,
        Err(Worker::Timeout) => Err(format!("no answer from {uris} within {} s", wait.as_secs())),
        Err(Worker::Spawn(e)) => Err(format!("cannot start a thread for the search: {e}")),
    }
}

struct Job {
    s: Arc<Settings>,
    dn: CString,
    password: Vec<u8>,
    filter: CString,
}

/// An open libldap handle, unbound (freed) when dropped.
struct Conn<'a> {
    lib: &'a Lib,
    ld: *mut c_void,
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        // SAFETY: `ld` is the live handle ldap_initialize made; this frees
        // it, and nothing uses it afterwards.
        unsafe { (self.lib.unbind)(self.ld, std::ptr::null_mut(), std::ptr::null_mut()) };
    }
}

fn timeval(d: Duration) -> libc::timeval {
    libc::timeval {
        tv_sec: d.as_secs().max(1) as libc::time_t,
        tv_usec: 0,
    }
}

impl<'a> Conn<'a> {
    /// A handle for the servers, with protocol 3, no referrals and the
    /// time limits; no network IO yet (the bind connects).
    fn open(lib: &'a Lib, uris: &CStr, timeout: Duration) -> Result<Conn<'a>, String> {
        let mut ld = std::ptr::null_mut();
        // SAFETY: a valid C string; `ld` receives the handle.
        let rc = unsafe { (lib.initialize)(&mut ld, uris.as_ptr()) };
        if rc != LDAP_SUCCESS || ld.is_null() {
            return Err(format!("ldap_initialize: {}", err_text(lib, rc)));
        }
        let c = Conn { lib, ld };
        let v3 = LDAP_VERSION3;
        let tv = timeval(timeout);
        let opts: [(c_int, *const c_void, &str); 4] = [
            (
                LDAP_OPT_PROTOCOL_VERSION,
                (&v3 as *const c_int).cast(),
                "protocol version",
            ),
            // LDAP_OPT_OFF is a NULL pointer.
            (LDAP_OPT_REFERRALS, std::ptr::null(), "referrals"),
            (
                LDAP_OPT_NETWORK_TIMEOUT,
                (&tv as *const libc::timeval).cast(),
                "network timeout",
            ),
            (
                LDAP_OPT_TIMEOUT,
                (&tv as *const libc::timeval).cast(),
                "timeout",
            ),
        ];
        for (opt, val, what) in opts {
            // SAFETY: a live handle and, per option, the value type
            // ldap_set_option(3) documents (int*, LDAP_OPT_OFF, struct
            // timeval*), which it copies; `v3` and `tv` outlive the call.
            let rc = unsafe { (lib.set_option)(c.ld, opt, val) };
            if rc != LDAP_OPT_SUCCESS {
                return Err(format!("ldap_set_option ({what}) failed"));
            }
        }
        Ok(c)
    }

    /// A simple bind.
    fn bind(&self, dn: &CStr, password: &[u8]) -> Result<(), String> {
        let cred = Berval {
            len: password.len() as c_ulong,
            val: password.as_ptr().cast(),
        };
        // SAFETY: a live handle, a valid C string, and a berval over
        // `password`, which outlives the call; LDAP_SASL_SIMPLE is a NULL
        // mechanism; no controls, no server credentials wanted.
        let rc = unsafe {
            (self.lib.bind)(
                self.ld,
                dn.as_ptr(),
                std::ptr::null(),
                &cred,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if rc == LDAP_SUCCESS {
            Ok(())
        } else {
            Err(err_text(self.lib, rc))
        }
    }

    /// A subtree search asking for `attr`: its answer, whose chain is
    /// freed when dropped.
    fn search(
        &self,
        base: &CStr,
        filter: &CStr,
        attr: &CStr,
        timeout: Duration,
    ) -> Result<Answer<'_>, String> {
        let attrs = [attr.as_ptr(), std::ptr::null()];
        let tv = timeval(timeout);
        let mut res = std::ptr::null_mut();
        // SAFETY: a live handle, valid C strings, a NULL-terminated
        // attribute list and a timeval that outlive the call; `res`
        // receives a message chain the Answer frees.
        let rc = unsafe {
            (self.lib.search)(
                self.ld,
                base.as_ptr(),
                LDAP_SCOPE_SUBTREE,
                filter.as_ptr(),
                attrs.as_ptr(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &tv,
                0,
                &mut res,
            )
        };
        let answer = Answer { conn: self, res };
        let entries = answer.count();
        match rc {
            LDAP_SUCCESS if entries >= 0 => Ok(answer),
            LDAP_SIZELIMIT_EXCEEDED if entries > 0 => Ok(answer),
            _ => Err(err_text(self.lib, rc)),
        }
    }
}

/// A search's chain of messages, freed when dropped.
struct Answer<'a> {
    conn: &'a Conn<'a>,
    res: *mut c_void,
}

impl Answer<'_> {
    /// How many entries it has; -1 when there is no chain.
    fn count(&self) -> c_int {
        if self.res.is_null() {
            return -1;
        }
        // SAFETY: the live handle and the chain its search returned.
        unsafe { (self.conn.lib.count)(self.conn.ld, self.res) }
    }

    /// The first value of `attr` in each entry that has one, in the
    /// order of the answer.
    fn first_values(&self, attr: &CStr) -> Vec<Vec<u8>> {
        let lib = self.conn.lib;
        let mut out = Vec::new();
        if self.res.is_null() {
            return out;
        }
        // SAFETY: the live handle and the chain its search returned; an
        // entry pointer is one of that chain's, valid while it is.
        let mut entry = unsafe { (lib.first_entry)(self.conn.ld, self.res) };
        while !entry.is_null() {
            // SAFETY: a live handle, an entry of its chain and a valid C
            // string; the array returned (NULL-terminated) is ours to
            // free with ldap_value_free_len, which we do once read.
            unsafe {
                let vals = (lib.get_values)(self.conn.ld, entry, attr.as_ptr());
                if !vals.is_null() {
                    let first = *vals;
                    if !first.is_null() && !(*first).val.is_null() {
                        let b = &*first;
                        out.push(
                            std::slice::from_raw_parts(b.val.cast::<u8>(), b.len as usize).to_vec(),
                        );
                    }
                    (lib.value_free)(vals);
                }
                entry = (lib.next_entry)(self.conn.ld, entry);
            }
        }
        out
    }
}

impl Drop for Answer<'_> {
    fn drop(&mut self) {
        if !self.res.is_null() {
            // SAFETY: frees the chain the search returned; not used after.
            unsafe { (self.conn.lib.msgfree)(self.res) };
        }
    }
}

/// One check, on its thread: the plugin's steps.
fn run(job: &Job) -> Result<(), Refused> {
    let lib = lib().map_err(Refused::Unavailable)?;
    let s = &job.s;
    let c =
        |t: &str| CString::new(t).map_err(|_| Refused::Unavailable("a NUL byte in the cfg".into()));
    let uris = c(&s.uris)?;
    {
        let conn = Conn::open(lib, &uris, s.timeout).map_err(Refused::Unavailable)?;
        conn.bind(&job.dn, &job.password)
            .map_err(Refused::UserBind)?;
    }
    let conn = Conn::open(lib, &uris, s.timeout).map_err(Refused::Unavailable)?;
    let dn = c(&s.bind_dn)?;
    let pw = s.bind_pw.as_deref().unwrap_or("");
    conn.bind(&dn, pw.as_bytes())
        .map_err(Refused::ServiceBind)?;
    let n = conn
        .search(&c(&s.sbase)?, &job.filter, &c(&s.user_attr)?, s.timeout)
        .map_err(Refused::Search)?
        .count();
    if n == 0 {
        Err(Refused::NotMember)
    } else {
        Ok(())
    }
}

/// The group search, on its worker thread.
fn search_members(q: &GroupSearch) -> Result<Vec<Vec<u8>>, String> {
    let lib = lib()?;
    let c = |t: &str| CString::new(t).map_err(|_| "a NUL byte in the cfg".to_string());
    let conn = Conn::open(lib, &c(&q.uris)?, q.timeout)?;
    let pw = q.bind_pw.as_deref().unwrap_or("");
    conn.bind(&c(&q.bind_dn)?, pw.as_bytes())
        .map_err(|e| format!("ldapconnect's bind as {}: {e}", q.bind_dn))?;
    let attr = c(&q.attr)?;
    let answer = conn
        .search(&c(&q.base)?, &c(&q.filter)?, &attr, q.timeout)
        .map_err(|e| format!("the search of {} for {}: {e}", q.base, q.filter))?;
    Ok(answer.first_values(&attr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            uris: "ldap://127.0.0.1".into(),
            bind_dn: "cn=admin,dc=x".into(),
            bind_pw: None,
            user_attr: "uid".into(),
            group_attr: "ou".into(),
            lowercase: false,
            userenv: "ou=people,dc=x".into(),
            sbase: "dc=x".into(),
            access: "internet".into(),
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn escaping_follows_the_plugin() {
        assert_eq!(escape_dn("a,b+c=d").unwrap(), "a\\2Cb\\2Bc\\3Dd");
        assert_eq!(escape_dn("a*b(c)").unwrap(), "a*b(c)");
        assert_eq!(escape_filter("a*b(c)\\").unwrap(), "a\\2Ab\\28c\\29\\5C");
        assert_eq!(escape_filter("a,b=c").unwrap(), "a,b=c");
        assert_eq!(escape_filter("é").unwrap(), "\\C3\\A9");
        assert_eq!(escape_dn("é").unwrap(), "é");
        assert_eq!(escape_dn("a\x01").unwrap(), "a\\01");
        assert!(escape_dn(&"a".repeat(511)).is_some());
        assert!(escape_dn(&"a".repeat(512)).is_none());
        assert!(escape_filter(&"*".repeat(171)).is_none());
    }

    #[test]
    fn dn_and_filter() {
        let (dn, f) = user_dn_and_filter(&settings(), "j)oe").unwrap();
        assert_eq!(dn, "uid=j)oe,ou=people,dc=x");
        assert_eq!(f, "(&(uid=j\\29oe)(ou=internet))");
        let long = "a".repeat(600);
        assert_eq!(
            user_dn_and_filter(&settings(), &long),
            Err(Refused::NameTooLong)
        );
        assert_eq!(Refused::NotMember.code(), 5);
        assert_eq!(Refused::UserBind(String::new()).code(), 7);
    }
}
