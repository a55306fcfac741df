//! Access control: the one call every service makes once it knows what a
//! client asks for (3proxy's auth.c `doauth`, `alwaysauth`; acl.c
//! `checkACL`).
//!
//! The cfg builds a [`Setup`] as it runs (`auth`, `allow`, `deny`, `flush`,
//! `users`, limits); each service line takes a [`Policy`] snapshot of it,
//! so a later `flush` or `auth` changes only the services after it. The
//! `users` table and the limits are process-wide, as in 3proxy: every
//! service sees every `users` line, and a `bandlimin` rule is shared by all
//! services.
//!
//! [`authorize`] tries the service's `auth` types in order: a type that
//! cannot grant access hands over to the next, one whose authentication
//! succeeded decides for good, and a code of 10 or more stops the chain.
//! After a grant, the limits (connlim, traffic quotas) are checked and the
//! bandwidth limiters chosen (`limit`). [`refuses_credentials`] tells,
//! before a request is known, whether the chain refuses a client on its
//! user name and password alone (SOCKS5's RFC 1929 exchange).
//!
//! Invariant: nothing here does IO, but `auth dnsname`, which looks the
//! client's address up in the resolver (`resolve::dnsname`, with its
//! DNS timeout), `auth pam` (`sys::pam`), `auth ldap` (`sys::ldap`, each
//! step within BYTE_LONG) and `auth radius`, which asks
//! the `radius` servers (`radius::authenticate`, each within the
//! BYTE_LONG timeout); a request costs a hash lookup per `users`/cache access
//! and O(log n) per big ACL list.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use crate::acl::{self, Action, Entry, Query, Verdict};
use crate::auth::{AuthCache, AuthType, CacheConf, CacheQuery, Users, CACHE_IN_USE};
use crate::limit::{Limits, SessionLimits};
use crate::res::Res;

/// Longest wait for PAM's answer to `auth pam` (a module may ask a
/// network directory); past it the login counts as refused.
pub const PAM_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

pub use crate::acl::Op;

/// What a client asks for, as far as the service knows it.
#[derive(Debug, Clone, Default)]
pub struct Request<'a> {
    pub op: Option<Op>,
    /// The client's address (after a PROXY header, if any).
    pub client: Option<SocketAddr>,
    /// The address the client connected to (the service side).
    pub local: Option<SocketAddr>,
    /// Destination host as the client (or the cfg) wrote it: a name, or
    /// an address's text. None with `addr` set: the address's printed
    /// form stands for it.
    pub host: Option<&'a str>,
    /// Destination address, when known.
    pub addr: Option<IpAddr>,
    pub port: u16,
    /// Credentials, when the protocol carried them.
    pub user: Option<&'a str>,
    pub password: Option<&'a str>,
    /// The client came through a local redirection: ACL entries that
    /// redirect locally are skipped (3proxy's second pass).
    pub redirected: bool,
    /// The service's log name (`%N`): `auth radius` sends it as
    /// NAS-Identifier.
    pub service: Option<&'static str>,
    /// The `connlim` rules the connection took when it was accepted
    /// (`limit::ConnHold::mark`), which its requests do not take again.
    pub connlim_early: Option<(usize, usize)>,
}

/// What an allowed request may use. Keep it for the whole session: it
/// holds the session's limits (a `connlim` slot is given back when the
/// last clone is dropped).
#[derive(Debug, Clone, Default)]
pub struct Grant {
    /// `nolog` on the matching ACL entry: write no log record.
    pub nolog: bool,
    /// The request's weight after the check (3proxy's `param->weight`:
    /// that of the last ACL entry that matched, or the one it came with).
    /// A service that serves several requests on one connection passes it
    /// to the next one ([`authorize_at`]).
    pub weight: u32,
    /// Bandwidth limiters and traffic counters of the session: pass it to
    /// `relay::relay_hooked` (or `SessionLimits::add` what moved otherwise) and keep
    /// it until the session ends; its drop updates the counters.
    pub limits: Option<Arc<SessionLimits>>,
    /// The `parent` chain of the matching entry (empty: connect directly);
    /// pass it to `chain::connect`.
    pub parents: crate::parent::Parents,
    /// The user name the auth cache (`authcache ip`) or `auth dnsname`
    /// supplied: the one to log.
    pub user: Option<String>,
    /// What an `auth radius` Access-Accept gave the session (its
    /// Framed-IP-Address is already the first hop of `parents`).
    pub radius: Option<Arc<crate::radius::Accepted>>,
}

/// The access part of the cfg script's state (3proxy's `conf.authfuncs`,
/// `conf.acl`, the password table, the limiter lists).
#[derive(Debug)]
pub struct Setup {
    /// `auth`; 3proxy starts (and reloads) with `auth iponly`.
    pub auth: Vec<AuthType>,
    /// The current ACL: `allow`/`deny` append, `flush` empties.
    pub acl: Arc<Vec<Entry>>,
    /// `users`, shared by all services.
    pub users: Arc<RwLock<Users>>,
    /// `connlim`, `bandlim*`, `count*`, `counter`: shared by all services.
    pub limits: Arc<Limits>,
    /// `force` (the default) / `noforce`: re-check sessions on reload.
    pub force: bool,
    /// `authcache`.
    pub cache: CacheConf,
    /// The PAM service `auth pam` asks (PamAuth's `plugin` line).
    pub pam_service: Option<Arc<str>>,
    /// LdapPlugin's settings, shared by every service (set when the cfg
    /// has loaded).
    pub ldap: Arc<crate::sys::ldap::Slot>,
    /// The `radius` servers, shared by every service of the cfg (the last
    /// `radius` line; set when the cfg has loaded).
    pub radius: Arc<crate::radius::Slot>,
    /// How often each limit line has appeared so far (`limit` keeps a
    /// rule's state under its line and repetition, across reloads).
    pub seen: HashMap<String, usize>,
    /// The index of the last ACL snapshot taken, reused by the next
    /// service line while the ACL is unchanged.
    index: std::sync::Mutex<Option<IndexedAcl>>,
}

/// An ACL and the index built for it.
type IndexedAcl = (Arc<Vec<Entry>>, Arc<acl::Index>);

impl Default for Setup {
    fn default() -> Self {
        Setup {
            auth: vec![AuthType::IpOnly],
            acl: Arc::default(),
            users: Arc::default(),
            limits: Arc::default(),
            force: true,
            cache: CacheConf::default(),
            pam_service: None,
            ldap: Arc::default(),
            radius: Arc::default(),
            seen: HashMap::new(),
            index: std::sync::Mutex::default(),
        }
    }
}

impl Setup {
    /// The snapshot a service line takes.
    pub fn snapshot(&self) -> Policy {
        if self
            .auth
            .iter()
            .any(|t| matches!(t, AuthType::Cache | AuthType::CacheAcl))
        {
            CACHE_IN_USE.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let index = {
            let mut cached = self.index.lock().unwrap_or_else(|e| e.into_inner());
            match &*cached {
                Some((acl, ix)) if Arc::ptr_eq(acl, &self.acl) => ix.clone(),
                _ => {
                    let ix = Arc::new(acl::Index::build(&self.acl));
                    *cached = Some((self.acl.clone(), ix.clone()));
                    ix
                }
            }
        };
        // Each service line gets its own ACL identity (3proxy copies the
        // list for every service), for the authcache's `acl` key.
        static IDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        Policy {
            id: IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            index,
            cache: self.cache,
            auth: self.auth.clone(),
            timed: self.acl.iter().any(|e| e.rule.timed()),
            acl: self.acl.clone(),
            users: self.users.clone(),
            limits: self.limits.clone(),
            force: self.force,
            pam_service: self.pam_service.clone(),
            ldap: self.ldap.clone(),
            radius: self.radius.clone(),
        }
    }
}

/// A service's view of access control, fixed when its line ran.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Unique per snapshot (service line): the ACL's identity.
    id: usize,
    pub auth: Vec<AuthType>,
    pub acl: Arc<Vec<Entry>>,
    /// Finds the first matching entry of a long `acl` without a walk.
    index: Arc<acl::Index>,
    /// Some ACL entry looks at the weekday or the time of day.
    timed: bool,
    pub users: Arc<RwLock<Users>>,
    pub limits: Arc<Limits>,
    pub cache: CacheConf,
    /// The PAM service of `auth pam`.
    pub pam_service: Option<Arc<str>>,
    /// LdapPlugin's settings, for `auth ldap`.
    pub ldap: Arc<crate::sys::ldap::Slot>,
    /// The `radius` servers of `auth radius`.
    pub radius: Arc<crate::radius::Slot>,
    pub force: bool,
}

/// How the ACL walk ended, when it allowed the request.
#[derive(Default)]
struct Allowed {
    nolog: bool,
    parents: crate::parent::Parents,
}

/// Authenticate and authorize a request against the service's `auth` and
/// ACL snapshot, then check the limits. Err carries 3proxy's code: 1
/// denied, 3 no rule matched, 4 no user name, 5 unknown user, 6-8 wrong
/// password, 10 a limit.
pub fn authorize(svc: &impl Scope, req: &Request<'_>) -> Result<Grant, Res> {
    authorize_at(svc, req, 0)
}

/// [`authorize`] for a request that comes with a weight: the
/// [`Grant::weight`] of the request before it on the same connection
/// (an ACL entry with a lower, non-zero weight is then passed over).
pub fn authorize_at(svc: &impl Scope, req: &Request<'_>, weight: u32) -> Result<Grant, Res> {
    let at = At {
        now: SystemTime::now(),
        srv: svc.listen_ip(),
        weight,
    };
    admit(svc.policy(), req, &at, true)
}

/// Whether the service's `auth` chain refuses a client on its user name
/// and password alone, before the client has said what it wants (the
/// SOCKS5 username/password sub-negotiation). `req` carries the client,
/// local address and credentials; its destination is not looked at.
///
/// Some(code) only when [`authorize`] would refuse every request this
/// client could make next with these credentials, with that same code:
/// the password check of `strong` fails (an empty `users` table aside),
/// and every type of the chain fails whatever the destination is, which
/// holds for `strong` itself and for a `cache`/`cacheacl` whose
/// `authcache` type keys only on what is known now (user, password,
/// client address, ACL, listening address) and that misses now. Any
/// other type (`none`, `iponly`, `useronly`, `dnsname`: the ACL may admit
/// the client without its password), a cache keyed on the destination or
/// operation, or a cache hit gives None: the request decides, as before.
/// The code is the highest of the chain (5 unknown user, 6-8 wrong
/// password), or one of 10 or more that stops it.
pub fn refuses_credentials(svc: &impl Scope, req: &Request<'_>) -> Option<Res> {
    refuses_credentials_at(svc.policy(), req, svc.listen_ip(), SystemTime::now())
}

fn refuses_credentials_at(
    p: &Policy,
    req: &Request<'_>,
    srv: Option<SocketAddr>,
    now: SystemTime,
) -> Option<Res> {
    if !p.auth.contains(&AuthType::Strong) {
        return None;
    }
    let bad = {
        let users = p.users.read().unwrap_or_else(|e| e.into_inner());
        if users.is_empty() {
            return None;
        }
        users.check(req.user, req.password).err()?
    };
    let cq = CacheQuery {
        user: req.user,
        password: req.password,
        client: req.client.map(|a| a.ip()),
        acl: if p.acl.is_empty() { 0 } else { p.id },
        srv,
        now: now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        ..CacheQuery::default()
    };
    let later = CacheConf::DSTADDR | CacheConf::DSTPORT | CacheConf::DSTHOST | CacheConf::DSTOPER;
    let mut worst = Res::OK;
    for t in &p.auth {
        let e = match t {
            AuthType::Strong => bad,
            AuthType::Cache | AuthType::CacheAcl if p.cache.kind & later == 0 => {
                AuthCache::global().lookup(&p.cache, &cq).err()?
            }
            _ => return None,
        };
        worst = worst.max(e);
        if worst >= Res::QUOTA {
            break;
        }
    }
    Some(worst)
}

/// What a request is checked against: a service's policy snapshot, its
/// listening address and its listener's key (`service::Service` is the
/// one implementation; the trait keeps this layer below it).
pub trait Scope {
    /// `auth`, the ACL, `users` and the limits at the service's line.
    fn policy(&self) -> &Policy;
    /// The listening address, for the `srvaddr`/`srvport` keys.
    fn listen_ip(&self) -> Option<SocketAddr>;
    /// What identifies the listener across reloads ([`Recheck`]).
    fn key(&self) -> &str;
}

/// Services are shared as `Arc<Service>`: callers pass them as they hold
/// them.
impl<T: Scope + ?Sized> Scope for std::sync::Arc<T> {
    fn policy(&self) -> &Policy {
        (**self).policy()
    }
    fn listen_ip(&self) -> Option<SocketAddr> {
        (**self).listen_ip()
    }
    fn key(&self) -> &str {
        (**self).key()
    }
}

/// When and where a request is checked, and the weight it comes with.
struct At {
    now: SystemTime,
    srv: Option<SocketAddr>,
    weight: u32,
}

/// [`authorize`] on a policy, at a given time (for tests).
#[cfg(test)]
pub fn authorize_policy(p: &Policy, req: &Request<'_>, now: SystemTime) -> Result<Grant, Res> {
    let at = At {
        now,
        srv: req.local,
        weight: 0,
    };
    admit(p, req, &at, true)
}

/// What a session was admitted with, kept to check it again after a
/// reload (`force`, 3proxy's default): the session goes on only if the
/// service's new policy still allows it. Limits are not taken again.
#[derive(Debug, Clone)]
pub struct Recheck {
    key: String,
    op: Option<Op>,
    client: Option<SocketAddr>,
    local: Option<SocketAddr>,
    host: Option<String>,
    addr: Option<IpAddr>,
    port: u16,
    user: Option<String>,
    password: Option<String>,
    redirected: bool,
    service: Option<&'static str>,
    /// The session's weight, updated by each check (a copy starts from
    /// the value at the time).
    weight: AtomicWeight,
    /// The reload generation of the settings the session was admitted
    /// with: any other generation seen later means a check is due.
    since: u64,
}

/// A weight that a shared `&Recheck` updates.
#[derive(Debug, Default)]
struct AtomicWeight(std::sync::atomic::AtomicU32);

impl Clone for AtomicWeight {
    fn clone(&self) -> Self {
        AtomicWeight(self.get().into())
    }
}

impl AtomicWeight {
    fn get(&self) -> u32 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn set(&self, w: u32) {
        self.0.store(w, std::sync::atomic::Ordering::Relaxed)
    }
}

impl Recheck {
    /// What to check again; the session's weight is 0 unless given with
    /// [`Recheck::at_weight`].
    pub fn new(svc: &impl Scope, req: &Request<'_>) -> Recheck {
        Recheck {
            weight: Default::default(),
            since: crate::generation::generation(),
            key: svc.key().to_string(),
            op: req.op,
            client: req.client,
            local: req.local,
            host: req.host.map(str::to_string),
            addr: req.addr,
            port: req.port,
            user: req.user.map(str::to_string),
            password: req.password.map(str::to_string),
            redirected: req.redirected,
            service: req.service,
        }
    }

    /// The session was admitted with the settings of reload `generation`
    /// (a client's, read when it was accepted), not those of now.
    pub fn since(mut self, generation: u64) -> Recheck {
        self.since = generation;
        self
    }

    /// The reload generation the session was last admitted under.
    pub fn generation(&self) -> u64 {
        self.since
    }

    /// The weight the session was granted with ([`Grant::weight`]).
    pub fn at_weight(self, weight: u32) -> Recheck {
        self.weight.set(weight);
        self
    }

    /// The key of the listener the session came through.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Check again against `now`, the settings serving this session's
    /// listener after a reload (`running::recheck` finds them). `noforce`
    /// in the new cfg leaves the session alone.
    pub fn check_against(&self, now: &impl Scope) -> Result<(), Res> {
        if !now.policy().force {
            return Ok(());
        }
        let req = Request {
            op: self.op,
            client: self.client,
            local: self.local,
            host: self.host.as_deref(),
            addr: self.addr,
            port: self.port,
            user: self.user.as_deref(),
            password: self.password.as_deref(),
            redirected: self.redirected,
            service: self.service,
            connlim_early: None,
        };
        let at = At {
            now: SystemTime::now(),
            srv: now.listen_ip(),
            weight: self.weight.get(),
        };
        let g = admit(now.policy(), &req, &at, false)?;
        self.weight.set(g.weight);
        Ok(())
    }
}

/// The `connlim` rules a new connection from `client` takes before its
/// head is read (`limit::Limits::start_connection`); Err 10 when one is
/// over its limit.
pub fn hold_connlim(
    svc: &impl Scope,
    client: Option<SocketAddr>,
) -> Result<Option<crate::limit::ConnHold>, Res> {
    let p = svc.policy();
    if !p.limits.has_connlim() {
        return Ok(None);
    }
    let (wday, daysec) = if p.limits.timed() {
        local_clock(SystemTime::now())
    } else {
        (0, 0)
    };
    let q = Query {
        src: client.map(|a| a.ip()),
        wday,
        daysec,
        ..Query::default()
    };
    p.limits.start_connection(&q).map(Some)
}

/// Authenticate and walk the ACL; then, with `with_limits`, take the
/// session's limits (connlim slot, bandwidth, counters).
fn admit(p: &Policy, req: &Request<'_>, at: &At, with_limits: bool) -> Result<Grant, Res> {
    // Host patterns see the request's host text; a service that has only
    // an address gives its printed form, as every 3proxy service sets
    // `hostname` to the text of the destination it was given.
    let host = match (req.host, req.addr) {
        (Some(h), _) => Some(acl::normalize_host(h)),
        (None, Some(a)) => Some(std::borrow::Cow::Owned(crate::addr::ip_text(a))),
        (None, None) => None,
    };
    let (wday, daysec) = if p.timed || p.limits.timed() {
        local_clock(at.now)
    } else {
        (0, 0)
    };
    let mut q = Query {
        user: req.user,
        src: req.client.map(|a| a.ip()),
        dst: req.addr,
        host: host.as_deref(),
        port: req.port,
        op: req.op.map(Op::bits).unwrap_or(0),
        wday,
        daysec,
        weight: at.weight,
        redirected: req.redirected,
    };
    let mut found = Found {
        weight: at.weight,
        user: None,
        route: None,
        radius: None,
    };

    let secs = at
        .now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let cq = CacheQuery {
        user: req.user,
        password: req.password,
        client: q.src,
        acl: if p.acl.is_empty() { 0 } else { p.id },
        dst: req.addr,
        port: req.port,
        host: q.host,
        op: q.op,
        srv: at.srv,
        now: secs,
    };
    let mut allowed = authenticate(p, req, at, &q, &cq, &mut found)?;
    if let Some(r) = found.route.filter(|_| q.op != acl::OpBits::BIND) {
        // The cached source goes first; an `extip` of the entry that
        // allowed the request overrides it, as in 3proxy.
        allowed.parents = crate::parent::prepend(&r, &allowed.parents);
    }
    q.weight = found.weight;
    // A name found by `cache` or `dnsname` is the session's user name.
    if found.user.is_some() {
        q.user = found.user.as_deref();
    }
    let limits = if with_limits {
        p.limits.start(&q, req.connlim_early)?
    } else {
        None
    };
    Ok(Grant {
        nolog: allowed.nolog,
        weight: found.weight,
        limits,
        parents: allowed.parents,
        user: found.user,
        radius: found.radius,
    })
}

/// What the walk through the `auth` types learns besides the entry that
/// allowed the request.
struct Found {
    /// 3proxy's `param->weight`: every ACL entry that matches sets it.
    weight: u32,
    /// A user name that `dnsname` or a cache hit supplied.
    user: Option<String>,
    /// `authcache ext`: the source a cache hit gave back.
    route: Option<crate::parent::Parents>,
    /// What an `auth radius` Access-Accept gave.
    radius: Option<Arc<crate::radius::Accepted>>,
}

/// Try the service's `auth` types in order (3proxy's `doauth`): the first
/// that allows the request decides, and its grant is cached when it may
/// be; a refusal hands over to the next type, but a code of 10 or more
/// (other than `auth radius`'s) ends the walk. Err: the worst refusal, or
/// the ACL's answer after a type authenticated.
fn authenticate(
    p: &Policy,
    req: &Request<'_>,
    at: &At,
    q: &Query<'_>,
    cq: &CacheQuery<'_>,
    found: &mut Found,
) -> Result<Allowed, Res> {
    let mut worst = Res::OK;
    for t in &p.auth {
        match auth_step(t, p, req, at, q, cq, found)? {
            Ok(mut a) => {
                cache_grant(t, p, req, cq, found.user.as_deref(), &mut a);
                return Ok(a);
            }
            Err(e) => {
                worst = worst.max(e);
                // `auth radius`'s refusals (25, 26) hand over like 1-9.
                if worst >= Res::QUOTA && !worst.is_auth() {
                    return Err(worst);
                }
            }
        }
    }
    // No `auth` types at all allows, as 3proxy's empty list does.
    if p.auth.is_empty() {
        Ok(Allowed::default())
    } else {
        Err(worst)
    }
}

/// One `auth` type's answer: Ok(Ok) allows, Ok(Err) refuses and lets the
/// next type try; Err is final (the ACL's refusal once the type
/// authenticated the client).
#[inline]
fn auth_step(
    t: &AuthType,
    p: &Policy,
    req: &Request<'_>,
    at: &At,
    q: &Query<'_>,
    cq: &CacheQuery<'_>,
    found: &mut Found,
) -> Result<Result<Allowed, Res>, Res> {
    Ok(match t {
        AuthType::None => Ok(Allowed::default()),
        AuthType::IpOnly => check_acl(p, &Query { user: None, ..*q }, &mut found.weight),
        // Once these authenticate, the ACL's answer is final.
        AuthType::UserOnly => match req.user {
            Some(_) => Ok(check_acl(p, q, &mut found.weight)?),
            None => Err(Res::AUTH_NO_USER),
        },
        // 3proxy's `dnsauth`: no name, an unconfirmed name or no
        // `nserver`/`authnserver` at all is code 3.
        AuthType::DnsName => {
            let name = q
                .src
                .and_then(|a| crate::resolve::dnsname(a.to_canonical()));
            match name {
                Some(n) => {
                    let user = Some(n.as_str());
                    let r = check_acl(p, &Query { user, ..*q }, &mut found.weight);
                    found.user = Some(n);
                    Ok(r?)
                }
                None => Err(Res::ACL_NO_MATCH),
            }
        }
        AuthType::Strong => {
            let users = p.users.read().unwrap_or_else(|e| e.into_inner());
            match users.check(req.user, req.password) {
                Ok(()) => {
                    drop(users);
                    Ok(check_acl(p, q, &mut found.weight)?)
                }
                Err(e) => Err(e),
            }
        }
        // PamAuth's `pamfunc`: 4 without a user name and password,
        // 5 when PAM says no.
        AuthType::Pam => match (req.user, req.password, p.pam_service.as_deref()) {
            (Some(u), Some(pw), Some(service)) => {
                use crate::sys::pam::{check, Refused};
                match check(service, u, pw, PAM_WAIT) {
                    Ok(()) => Ok(check_acl(p, q, &mut found.weight)?),
                    Err(Refused::Denied) => Err(Res::AUTH_BAD_USER),
                    Err(Refused::TimedOut) => {
                        log::warn!("auth pam: no answer from PAM in {PAM_WAIT:?}");
                        Err(Res::AUTH_BAD_USER)
                    }
                    Err(Refused::Unavailable(why)) => {
                        log::warn!("auth pam: {why}");
                        Err(Res::AUTH_BAD_USER)
                    }
                }
            }
            _ => Err(Res::AUTH_NO_USER),
        },
        AuthType::Ldap => match auth_ldap(p, req) {
            Ok(None) => Ok(check_acl(p, q, &mut found.weight)?),
            Ok(Some(lower)) => {
                // `ldapattr`'s lowercasing: the name the ACL, the log and
                // the authcache see, as the plugin changes 3proxy's.
                let r = check_acl(
                    p,
                    &Query {
                        user: Some(&lower),
                        ..*q
                    },
                    &mut found.weight,
                );
                found.user = Some(lower);
                Ok(r?)
            }
            Err(e) => Err(e),
        },
        AuthType::Radius => match auth_radius(p, req, at, q) {
            Ok(acc) => {
                let a = check_acl(p, q, &mut found.weight)?;
                let a = framed(a, &acc);
                found.radius = Some(acc);
                Ok(a)
            }
            Err(e) => Err(e),
        },
        // utf8tocp1251's `aufunc`: always 4, so the next type is asked
        // (the recoding is `charset`'s, see `AuthType::Utf8ToCp1251`).
        AuthType::Utf8ToCp1251 => Err(Res::AUTH_NO_USER),
        AuthType::Cache | AuthType::CacheAcl => match AuthCache::global().lookup(&p.cache, cq) {
            Ok(hit) => {
                if hit.user.is_some() {
                    found.user = hit.user;
                }
                found.route = hit.route;
                if *t == AuthType::CacheAcl {
                    // The cached grant stands for the ACL too.
                    Ok(Allowed::default())
                } else {
                    let user = found.user.as_deref().or(req.user);
                    Ok(check_acl(p, &Query { user, ..*q }, &mut found.weight)?)
                }
            }
            Err(e) => Err(e),
        },
    })
}

/// LdapPlugin's `ldapfunc`: 4 without a user name or with an empty
/// password; 5 for a name too long or a user outside the `ldapaccess`
/// group; 7 when a bind or the search fails, no server answers in time,
/// or libldap cannot be used. Ok carries the lowercased name when
/// `ldapattr` asks for it and it differs.
fn auth_ldap(p: &Policy, req: &Request<'_>) -> Result<Option<String>, Res> {
    let (Some(user), Some(pw)) = (req.user, req.password) else {
        return Err(Res::AUTH_NO_USER);
    };
    if pw.is_empty() {
        return Err(Res::AUTH_NO_USER);
    }
    let Some(s) = p.ldap.get() else {
        log::warn!("auth ldap: LdapPlugin's settings are missing");
        return Err(Res::AUTH_BAD_CR);
    };
    let lower = (s.lowercase && user.bytes().any(|b| b.is_ascii_uppercase()))
        .then(|| user.to_ascii_lowercase());
    match crate::sys::ldap::check(s, lower.as_deref().unwrap_or(user), pw) {
        Ok(()) => Ok(lower),
        Err(e) => {
            use crate::sys::ldap::Refused;
            match &e {
                Refused::NotMember | Refused::NameTooLong | Refused::UserBind(_) => {
                    log::debug!("auth ldap: {e:?}")
                }
                _ => log::warn!("auth ldap: {e:?}"),
            }
            Err(if e.code() == 5 {
                Res::AUTH_BAD_USER
            } else {
                Res::AUTH_BAD_CR
            })
        }
    }
}

/// Cache the grant of `auth` type `t`, when it makes an entry: `found_user`
/// is the name `dnsname` found.
fn cache_grant(
    t: &AuthType,
    p: &Policy,
    req: &Request<'_>,
    cq: &CacheQuery<'_>,
    found_user: Option<&str>,
    a: &mut Allowed,
) {
    // As 3proxy's `doauth`: every type but `none` and the
    // cache's own makes an entry once it has a user name (the
    // client's, or the one `dnsname` found) and, if the type
    // keys on it, a password.
    let user = match t {
        AuthType::DnsName => found_user,
        AuthType::Ldap => found_user.or(req.user),
        _ => req.user,
    };
    let cacheable = !matches!(t, AuthType::None | AuthType::Cache | AuthType::CacheAcl)
        && user.is_some()
        && (p.cache.kind & CacheConf::PASS == 0 || req.password.is_some());
    if cacheable && CACHE_IN_USE.load(std::sync::atomic::Ordering::Relaxed) {
        let mut source = None;
        if p.cache.kind & CacheConf::EXT != 0
            && a.parents
                .iter()
                .any(|h| h.kind == crate::parent::Kind::ExtIp)
        {
            // Draw the parents now, so the source address
            // cached is the one this session uses.
            let (src, chain) = crate::parent::settle(&a.parents, req.client);
            source = src;
            a.parents = chain;
        }
        AuthCache::global().insert(&p.cache, &CacheQuery { user, ..*cq }, source);
    }
}

/// `auth radius`: ask the `radius` servers. Out of [`admit`]'s body,
/// which every request runs.
#[inline(never)]
fn auth_radius(
    p: &Policy,
    req: &Request<'_>,
    at: &At,
    q: &Query<'_>,
) -> Result<Arc<crate::radius::Accepted>, Res> {
    let (Some(u), conf) = (req.user, p.radius.get()) else {
        return Err(Res::AUTH_NO_USER);
    };
    let Some(conf) = conf else {
        return Err(Res::RADIUS_NO_ANSWER);
    };
    let f = crate::radius::Fields {
        user: Some(u.to_string()),
        client: req.client,
        local: req.local,
        nas_port: at.srv.or(req.local).map_or(0, |a| a.port()),
        nas_id: req.service.unwrap_or("").to_string(),
        host: q.host.map(str::to_string),
        dst: req.addr,
        port: req.port,
        op: Some(q.op << 8),
        session_id: crate::radius::session_id(at.now),
    };
    crate::radius::authenticate(conf, &f, req.password).map(Arc::new)
}

/// An `auth radius` Access-Accept's Framed-IP-Address is the user's
/// outgoing address: an `extip` hop before the entry's own parents.
#[inline(never)]
fn framed(mut a: Allowed, acc: &crate::radius::Accepted) -> Allowed {
    if let Some(ip) = acc.framed_ip {
        let src = crate::parent::from_source(ip);
        a.parents = crate::parent::prepend(&src, &a.parents);
    }
    a
}

/// Walk the ACL (3proxy's `checkACL`): empty allows, a `deny` gives 1, no
/// match gives 3. An entry that matches sets `weight` to its own.
fn check_acl(p: &Policy, q: &Query<'_>, weight: &mut u32) -> Result<Allowed, Res> {
    let acl = &p.acl[..];
    let q = Query {
        weight: *weight,
        ..*q
    };
    match acl::check_indexed(acl, &p.index, &q) {
        Verdict::Empty => Ok(Allowed::default()),
        Verdict::NoMatch => Err(Res::ACL_NO_MATCH),
        Verdict::Matched(i) => {
            let e = &acl[i];
            *weight = e.rule.weight;
            match e.action {
                Action::Allow => Ok(Allowed {
                    nolog: e.nolog,
                    parents: e.parents.clone(),
                }),
                Action::Deny => Err(Res::ACL_DENY),
            }
        }
    }
}

/// Weekday (0 = Sunday) and seconds since midnight, in local time.
pub fn local_clock(t: SystemTime) -> (u8, u32) {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let tm = crate::sys::time::local(secs);
    (tm.wday as u8, tm.hour * 3600 + tm.min * 60 + tm.sec.min(59))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(action: Action, line: &str) -> Entry {
        let f: Vec<String> = line.split_whitespace().map(String::from).collect();
        Entry {
            action,
            rule: acl::Rule::parse(&f).unwrap(),
            nolog: false,
            parents: Default::default(),
        }
    }

    fn policy(auth: &[AuthType], acl: Vec<Entry>, users: &str) -> Policy {
        let mut u = Users::default();
        let args: Vec<String> = users.split_whitespace().map(String::from).collect();
        u.add_line(&args).unwrap();
        let setup = Setup {
            auth: auth.to_vec(),
            acl: Arc::new(acl),
            users: Arc::new(RwLock::new(u)),
            ..Setup::default()
        };
        setup.snapshot()
    }

    fn req<'a>(src: &str, user: Option<&'a str>, pass: Option<&'a str>) -> Request<'a> {
        Request {
            op: Some(Op::Connect),
            client: Some(SocketAddr::new(src.parse().unwrap(), 5000)),
            addr: Some("192.0.2.1".parse().unwrap()),
            port: 80,
            user,
            password: pass,
            ..Request::default()
        }
    }

    fn run(p: &Policy, r: &Request<'_>) -> Result<(), u32> {
        authorize_policy(p, r, SystemTime::now())
            .map(|_| ())
            .map_err(|e| e.0)
    }

    use AuthType::{IpOnly, Strong, UserOnly};

    #[test]
    fn default_is_iponly_and_enforces_the_acl() {
        let p = Setup::default().snapshot();
        assert_eq!(p.auth, [IpOnly]);
        assert_eq!(
            run(&p, &req("10.0.0.1", None, None)),
            Ok(()),
            "empty ACL allows"
        );
        let p = policy(&[IpOnly], vec![entry(Action::Allow, "* 10.0.0.0/8")], "");
        assert_eq!(run(&p, &req("10.0.0.1", None, None)), Ok(()));
        assert_eq!(
            run(&p, &req("11.0.0.1", None, None)),
            Err(3),
            "implicit deny"
        );
        let p = policy(&[IpOnly], vec![entry(Action::Deny, "* * * 80")], "");
        assert_eq!(run(&p, &req("10.0.0.1", None, None)), Err(1));
    }

    #[test]
    fn iponly_hides_the_user_name() {
        let p = policy(&[IpOnly], vec![entry(Action::Allow, "alice")], "alice:pw");
        assert_eq!(run(&p, &req("10.0.0.1", Some("alice"), Some("pw"))), Err(3));
        let p = policy(&[IpOnly], vec![entry(Action::Allow, "-")], "");
        assert_eq!(run(&p, &req("10.0.0.1", Some("alice"), None)), Ok(()));
    }

    #[test]
    fn none_skips_the_acl() {
        let p = policy(&[AuthType::None], vec![entry(Action::Deny, "*")], "");
        assert_eq!(run(&p, &req("10.0.0.1", None, None)), Ok(()));
    }

    #[test]
    fn strong_codes_and_acl() {
        let acl = vec![
            entry(Action::Deny, "bob"),
            entry(Action::Allow, "alice,bob"),
        ];
        let p = policy(&[Strong], acl, "alice:pw bob:pw");
        assert_eq!(run(&p, &req("10.0.0.1", None, None)), Err(4));
        assert_eq!(run(&p, &req("10.0.0.1", Some("eve"), Some("pw"))), Err(5));
        assert_eq!(run(&p, &req("10.0.0.1", Some("alice"), Some("no"))), Err(6));
        assert_eq!(run(&p, &req("10.0.0.1", Some("alice"), Some("pw"))), Ok(()));
        assert_eq!(run(&p, &req("10.0.0.1", Some("bob"), Some("pw"))), Err(1));
    }

    #[test]
    fn useronly_takes_any_name() {
        let p = policy(&[UserOnly], vec![entry(Action::Allow, "guest")], "");
        assert_eq!(run(&p, &req("10.0.0.1", Some("guest"), None)), Ok(()));
        assert_eq!(run(&p, &req("10.0.0.1", Some("other"), None)), Err(3));
        assert_eq!(run(&p, &req("10.0.0.1", None, None)), Err(4));
    }

    #[test]
    fn iponly_strong_falls_through() {
        // Local clients need no password; others need one.
        let acl = vec![
            entry(Action::Allow, "* 127.0.0.0/8"),
            entry(Action::Allow, "alice"),
        ];
        let p = policy(&[IpOnly, Strong], acl, "alice:pw");
        assert_eq!(run(&p, &req("127.0.0.1", None, None)), Ok(()));
        // Not allowed by address, no user: the highest code, 4, is what a
        // client sees (an HTTP proxy asks for a password).
        assert_eq!(run(&p, &req("10.0.0.1", None, None)), Err(4));
        assert_eq!(
            run(&p, &req("10.0.0.1", Some("alice"), Some("bad"))),
            Err(6)
        );
        assert_eq!(run(&p, &req("10.0.0.1", Some("alice"), Some("pw"))), Ok(()));
    }

    #[test]
    fn a_deny_after_authentication_is_final() {
        // strong authenticates alice; the ACL denies her; iponly after it
        // is not tried although it would allow.
        let acl = vec![entry(Action::Deny, "alice"), entry(Action::Allow, "-")];
        let p = policy(&[Strong, IpOnly], acl, "alice:pw");
        assert_eq!(run(&p, &req("10.0.0.1", Some("alice"), Some("pw"))), Err(1));
        assert_eq!(run(&p, &req("10.0.0.1", None, None)), Ok(()));
    }

    #[test]
    fn cache_after_strong() {
        // `auth cache strong` with `authcache ip`: a password once, then
        // the address alone stands for the user until the entry expires.
        let mut p = policy(
            &[AuthType::Cache, Strong],
            vec![entry(Action::Allow, "carol")],
            "carol:pw",
        );
        p.cache = CacheConf {
            kind: CacheConf::IP,
            secs: 60,
            size: 100,
        };
        CACHE_IN_USE.store(true, std::sync::atomic::Ordering::Relaxed);
        let t0 = SystemTime::now();
        let at = |r: &Request<'_>, secs: u64| {
            authorize_policy(&p, r, t0 + std::time::Duration::from_secs(secs))
        };
        let src = "192.0.2.77";
        assert_eq!(at(&req(src, None, None), 0).unwrap_err(), Res(4));
        assert!(at(&req(src, Some("carol"), Some("pw")), 0).is_ok());
        let g = at(&req(src, None, None), 59).unwrap();
        assert_eq!(g.user.as_deref(), Some("carol"));
        assert_eq!(at(&req("192.0.2.78", None, None), 1).unwrap_err(), Res(4));
        assert_eq!(
            at(&req(src, None, None), 60).unwrap_err(),
            Res(4),
            "expired"
        );
    }

    fn cached(kind: u32) -> CacheConf {
        CACHE_IN_USE.store(true, std::sync::atomic::Ordering::Relaxed);
        CacheConf {
            kind,
            secs: 60,
            size: 1000,
        }
    }

    #[test]
    fn cacheacl_stands_for_the_acl_within_its_key() {
        // `auth cacheacl strong`, `authcache ip,dstport`: once dave has
        // given his password for port 80, the address alone passes for
        // port 80, even where the ACL would now refuse (no user name), but
        // not for another port.
        let mut p = policy(
            &[AuthType::CacheAcl, Strong],
            vec![entry(Action::Allow, "dave")],
            "dave:pw",
        );
        p.cache = cached(CacheConf::IP | CacheConf::DSTPORT);
        let src = "192.0.2.81";
        assert_eq!(run(&p, &req(src, None, None)), Err(4));
        assert_eq!(run(&p, &req(src, Some("dave"), Some("pw"))), Ok(()));
        let g = authorize_policy(&p, &req(src, None, None), SystemTime::now()).unwrap();
        assert_eq!(g.user.as_deref(), Some("dave"));
        let mut other = req(src, None, None);
        other.port = 81;
        assert_eq!(run(&p, &other), Err(4));
        // `cache` instead checks the ACL with the cached name.
        let mut p2 = policy(
            &[AuthType::Cache, Strong],
            vec![
                entry(Action::Deny, "dave * * 80"),
                entry(Action::Allow, "dave"),
            ],
            "dave:pw",
        );
        p2.cache = p.cache;
        assert_eq!(run(&p2, &req(src, None, None)), Err(1));
    }

    #[test]
    fn the_acl_key_is_per_service_line() {
        // Two services after the same ACL (no `flush` between them) do not
        // share `authcache acl` entries: 3proxy copies the ACL for each.
        let setup = Setup {
            auth: vec![AuthType::Cache, Strong],
            acl: Arc::new(vec![entry(Action::Allow, "erin")]),
            users: Arc::new(RwLock::new({
                let mut u = Users::default();
                u.add_line(&["erin:pw".to_string()]).unwrap();
                u
            })),
            cache: cached(CacheConf::IP | CacheConf::ACL),
            ..Setup::default()
        };
        let (a, b) = (setup.snapshot(), setup.snapshot());
        let src = "192.0.2.82";
        assert_eq!(run(&a, &req(src, Some("erin"), Some("pw"))), Ok(()));
        assert_eq!(run(&a, &req(src, None, None)), Ok(()));
        assert_eq!(run(&b, &req(src, None, None)), Err(4));
        // Services without an ACL all share the same (empty) one.
        let open = Setup {
            auth: vec![AuthType::Cache, AuthType::UserOnly],
            cache: cached(CacheConf::IP | CacheConf::ACL),
            ..Setup::default()
        };
        let (c, d) = (open.snapshot(), open.snapshot());
        let src = "192.0.2.83";
        assert_eq!(run(&c, &req(src, Some("x"), None)), Ok(()));
        let g = authorize_policy(&d, &req(src, None, None), SystemTime::now()).unwrap();
        assert_eq!(g.user.as_deref(), Some("x"));
    }

    #[test]
    fn ext_keeps_the_drawn_source_address() {
        // Two `extip` parents of weight 500: each request draws one. With
        // `authcache ip,ext` the draw made at the password check is given
        // back on every cache hit.
        let hop = |a: &str| {
            let f: Vec<String> = format!("500 extip {a} 0")
                .split(' ')
                .map(String::from)
                .collect();
            crate::parent::Hop::parse(&f, |s| s.parse().map_err(|_| s.to_string())).unwrap()
        };
        let mut e = entry(Action::Allow, "*");
        e.parents = Arc::from(vec![hop("127.0.0.2"), hop("127.0.0.3")]);
        let mut p = policy(&[AuthType::CacheAcl, Strong], vec![e], "fay:pw");
        p.cache = cached(CacheConf::IP | CacheConf::EXT);
        let src = "192.0.2.84";
        let first = authorize_policy(&p, &req(src, Some("fay"), Some("pw")), SystemTime::now())
            .unwrap()
            .parents;
        assert_eq!(first.len(), 1, "{first:?}");
        let ip = first[0].addr.ip();
        assert!(["127.0.0.2", "127.0.0.3"].contains(&ip.to_string().as_str()));
        for _ in 0..20 {
            let g = authorize_policy(&p, &req(src, None, None), SystemTime::now()).unwrap();
            assert_eq!(g.parents.len(), 1);
            assert_eq!(g.parents[0].addr.ip(), ip);
        }
        // Without `ext` a hit has no parents (cacheacl checks no ACL).
        p.cache = cached(CacheConf::IP);
        let src = "192.0.2.85";
        assert_eq!(run(&p, &req(src, Some("fay"), Some("pw"))), Ok(()));
        let g = authorize_policy(&p, &req(src, None, None), SystemTime::now()).unwrap();
        assert!(g.parents.is_empty());
    }

    /// `refuses_credentials` for `user`/`pass` from `src`, each answer
    /// checked against `authorize` on a few destinations: a refusal must
    /// be the code every request gets.
    fn early(p: &Policy, src: &str, user: &str, pass: &str) -> Option<u32> {
        let r = req(src, Some(user), Some(pass));
        let known = Request {
            op: None,
            addr: None,
            port: 0,
            ..r.clone()
        };
        let got = refuses_credentials_at(p, &known, None, SystemTime::now()).map(|e| e.0);
        if let Some(code) = got {
            for (op, port) in [(Op::Connect, 80), (Op::Bind, 0), (Op::UdpAssoc, 53)] {
                let r = Request {
                    op: Some(op),
                    port,
                    ..r.clone()
                };
                assert_eq!(run(p, &r), Err(code), "{op:?} {port}");
            }
        }
        got
    }

    #[test]
    fn strong_alone_refuses_bad_credentials_early() {
        let acl = vec![entry(Action::Allow, "alice")];
        let p = policy(
            &[Strong],
            acl,
            "alice:pw c:CR:$1$saltsalt$qjXMvbEw8oaL.CzflDtaK/",
        );
        let src = "10.0.0.1";
        assert_eq!(early(&p, src, "alice", "no"), Some(6));
        assert_eq!(early(&p, src, "c", "no"), Some(7));
        assert_eq!(early(&p, src, "eve", "pw"), Some(5));
        assert_eq!(early(&p, src, "", ""), Some(5));
        // A right password waits for the request (and its ACL check),
        // even when the ACL will refuse it.
        assert_eq!(early(&p, src, "alice", "pw"), None);
        assert_eq!(early(&p, src, "c", "password"), None);
        // `strong` twice is still decided by the password.
        let p = policy(&[Strong, Strong], vec![], "alice:pw");
        assert_eq!(early(&p, src, "alice", "no"), Some(6));
    }

    #[test]
    fn a_type_that_may_admit_without_the_password_waits() {
        let acl = vec![
            entry(Action::Allow, "* 127.0.0.0/8"),
            entry(Action::Allow, "alice"),
        ];
        for chain in [
            &[IpOnly, Strong][..],
            &[Strong, IpOnly],
            &[UserOnly, Strong],
            &[Strong, AuthType::None],
            &[AuthType::DnsName, Strong],
            &[IpOnly],
            &[AuthType::None],
        ] {
            let p = policy(chain, acl.clone(), "alice:pw");
            assert_eq!(early(&p, "10.0.0.1", "alice", "no"), None, "{chain:?}");
            assert_eq!(early(&p, "10.0.0.1", "eve", "no"), None, "{chain:?}");
        }
        // `auth strong` without a `users` table: as before, at the request.
        let p = policy(&[Strong], vec![], "");
        assert_eq!(early(&p, "10.0.0.1", "alice", "no"), None);
    }

    #[test]
    fn a_cache_refuses_early_only_when_it_misses_on_what_is_known() {
        let src = "192.0.2.90";
        // `authcache user,password` (the default): a miss, then strong.
        let mut p = policy(&[AuthType::Cache, Strong], vec![], "hal:pw");
        p.cache = cached(CacheConf::USER | CacheConf::PASS);
        assert_eq!(early(&p, src, "hal", "no"), Some(6));
        assert_eq!(early(&p, src, "nohal", "pw"), Some(5));
        // `authcache ip`: once hal gave his password from this address,
        // the address stands for him, whatever password comes next.
        let mut p = policy(&[AuthType::Cache, Strong], vec![], "hal:pw");
        p.cache = cached(CacheConf::IP);
        assert_eq!(early(&p, src, "hal", "no"), Some(6));
        assert_eq!(run(&p, &req(src, Some("hal"), Some("pw"))), Ok(()));
        assert_eq!(early(&p, src, "hal", "no"), None);
        assert_eq!(run(&p, &req(src, Some("hal"), Some("no"))), Ok(()));
        assert_eq!(early(&p, "192.0.2.91", "hal", "no"), Some(6));
        // A key with the destination or the operation cannot be looked
        // up before the request.
        for bit in [
            CacheConf::DSTADDR,
            CacheConf::DSTPORT,
            CacheConf::DSTHOST,
            CacheConf::DSTOPER,
        ] {
            let mut p = policy(&[AuthType::CacheAcl, Strong], vec![], "hal:pw");
            p.cache = cached(CacheConf::IP | bit);
            assert_eq!(early(&p, "192.0.2.92", "hal", "no"), None, "{bit:#x}");
        }
        // `ip,user,limit`: hal's entry is pinned to his address; from
        // another one the cache says 10, which ends the chain.
        let mut p = policy(&[AuthType::Cache, Strong], vec![], "hal:pw");
        p.cache = cached(CacheConf::IP | CacheConf::USER | CacheConf::LIMIT);
        assert_eq!(run(&p, &req("192.0.2.93", Some("hal"), Some("pw"))), Ok(()));
        assert_eq!(early(&p, "192.0.2.94", "hal", "no"), Some(10));
    }

    #[test]
    fn weight_passes_over_lighter_entries() {
        let w = |line: &str, weight: u32| {
            let mut e = entry(Action::Allow, line);
            e.rule.weight = weight;
            e
        };
        let acl = vec![
            w("* * * 80", 500),
            w("* * * *", 100),
            entry(Action::Allow, "* * * 25"),
        ];
        let p = policy(&[IpOnly], acl, "");
        let at = |r: &Request<'_>, weight: u32| {
            let at = At {
                now: SystemTime::now(),
                srv: None,
                weight,
            };
            admit(&p, r, &at, true).map(|g| g.weight)
        };
        let mut r = req("10.0.0.1", None, None);
        // A fresh request matches the heavy entry and takes its weight.
        assert_eq!(at(&r, 0), Ok(500));
        r.port = 81;
        assert_eq!(at(&r, 0), Ok(100));
        // After weight 500, the entry of weight 100 is passed over.
        assert_eq!(at(&r, 500), Err(Res(3)));
        // An entry without a weight matches any, and sets the weight to 0.
        r.port = 25;
        assert_eq!(at(&r, 500), Ok(0));
    }

    #[test]
    fn a_deny_that_matched_sets_the_weight_for_the_next_type() {
        // iponly matches the deny (weight 900); strong then passes over
        // the allow of weight 100 and takes the one without a weight.
        let acl = vec![
            entry(Action::Deny, "- * * * * * * 900"),
            entry(Action::Allow, "gus * * * * * * 100"),
            entry(Action::Allow, "gus"),
        ];
        let p = policy(&[IpOnly, Strong], acl, "gus:pw");
        let g = authorize_policy(
            &p,
            &req("10.0.0.1", Some("gus"), Some("pw")),
            SystemTime::now(),
        );
        assert_eq!(g.unwrap().weight, 0);
    }

    #[test]
    fn nolog_and_weight_come_from_the_matching_entry() {
        let mut e = entry(Action::Allow, "* * * * * * * 7");
        e.nolog = true;
        let p = policy(&[IpOnly], vec![e], "");
        let g = authorize_policy(&p, &req("10.0.0.1", None, None), SystemTime::now()).unwrap();
        assert!(g.nolog);
        assert_eq!(g.weight, 7);
    }

    #[test]
    fn dnsname_without_a_name_server_is_code_3() {
        // No `nserver`/`authnserver` in this process: no name, code 3 (as
        // 3proxy's dnsauth), and the next type is tried.
        let acl = vec![entry(Action::Allow, "host.test"), entry(Action::Allow, "-")];
        let p = policy(&[AuthType::DnsName], acl.clone(), "");
        assert_eq!(run(&p, &req("127.0.0.1", None, None)), Err(3));
        let p = policy(&[AuthType::DnsName, IpOnly], acl, "");
        assert_eq!(run(&p, &req("127.0.0.1", None, None)), Ok(()));
    }

    #[test]
    fn a_long_acl_is_answered_through_its_index() {
        let mut acl: Vec<Entry> = (0..5000u32)
            .map(|i| {
                let a = std::net::Ipv4Addr::from(0x0b00_0000 + i * 4);
                entry(Action::Allow, &format!("* {a}/30"))
            })
            .collect();
        acl.push(entry(Action::Deny, "* 10.0.0.0/8 * 25"));
        acl.push(entry(Action::Allow, "alice 10.0.0.0/8"));
        let p = policy(&[Strong], acl, "alice:pw bob:pw");
        assert!(p.index.enabled());
        assert_eq!(run(&p, &req("10.1.2.3", Some("alice"), Some("pw"))), Ok(()));
        assert_eq!(run(&p, &req("10.1.2.3", Some("bob"), Some("pw"))), Err(3));
        assert_eq!(run(&p, &req("11.0.0.5", Some("bob"), Some("pw"))), Ok(()));
        let mut r = req("10.1.2.3", Some("alice"), Some("pw"));
        r.port = 25;
        assert_eq!(run(&p, &r), Err(1));
    }
}
