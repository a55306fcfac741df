//! Authentication: the `auth` types, the `users` table and its password
//! checks (3proxy's auth.c `authfuncs[]`, `strongauth`; conf.c `h_users`).
//! The hashes themselves are made by `crypt`.
//!
//! Passwords are kept as `users` gave them: cleartext (`CL`), a crypt
//! string (`CR`, `$1$` MD5-crypt or 3proxy's `$3$` BLAKE2b-crypt) or an NT
//! hash (`NT`, 32 hex digits). Checking a password never branches on its
//! content: comparisons run in constant time for a given length.
//!
//! Invariant: parsing is pure; the user table is a hash map, so a lookup
//! costs O(1) whatever its size.

use std::collections::HashMap;

use crate::conf::token::quote;
use crate::crypt::{crypt, nt_hash};
use crate::res::Res;

/// One `auth` type (3proxy's `authfuncs[]` entry names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthType {
    /// No authentication and no ACL; limits still apply.
    None,
    /// The ACL decides, with the user name hidden.
    IpOnly,
    /// Any user name is accepted, then the ACL decides.
    UserOnly,
    /// The client's forward-confirmed DNS name (PTR, then A/AAAA back to
    /// the same address, through `authnserver` or the `nserver`s) becomes
    /// the user name, then the ACL decides.
    DnsName,
    /// User name and password checked against `users`, then the ACL.
    Strong,
    /// An authcache hit stands for authentication, then the ACL.
    Cache,
    /// An authcache hit stands for authentication and authorization.
    CacheAcl,
    /// User name and password checked by the system's PAM (PamAuth's
    /// `pam`, with the service its `plugin` line named), then the ACL.
    Pam,
    /// User name and password checked by the servers of the `radius`
    /// line (an Access-Request), then the ACL.
    Radius,
    /// User name and password checked against an LDAP directory
    /// (LdapPlugin's `ldap`, with its `ldap*` commands' settings): a bind
    /// as the user, then a search for the user in the `ldapaccess`
    /// group; then the ACL.
    Ldap,
    /// utf8tocp1251's step: the login is recoded for the types after it
    /// and the next type is asked (3proxy's plugin returns 4). Logins are
    /// text here, so the recoding is [`crate::charset`]'s reading of the
    /// cfg and of the client's bytes; the step only hands on.
    Utf8ToCp1251,
}

impl AuthType {
    /// Parse an `auth` argument. Types 3proxy has that this build lacks
    /// are refused with a reason, never ignored.
    pub fn parse(s: &str) -> Result<AuthType, String> {
        Ok(match s {
            "none" => AuthType::None,
            "iponly" => AuthType::IpOnly,
            "useronly" => AuthType::UserOnly,
            "strong" => AuthType::Strong,
            "cache" => AuthType::Cache,
            "cacheacl" => AuthType::CacheAcl,
            "dnsname" => AuthType::DnsName,
            "radius" => AuthType::Radius,
            "pam" => AuthType::Pam,
            "utf8tocp1251" => AuthType::Utf8ToCp1251,
            "ldap" => AuthType::Ldap,
            "windows" => {
                return Err(
                    "auth type 'windows' comes with the WindowsAuthentication plugin, \
                     which is not built (see PLUGINS in 3proxy.cfg(5))"
                        .into(),
                );
            }
            _ => return Err(format!("unknown auth type '{}'", quote(s))),
        })
    }
}

/// A stored password, as the `users` line gave it.
#[derive(Clone, PartialEq, Eq)]
pub enum Password {
    /// `CL`: cleartext.
    Clear(String),
    /// `CR`: a `$1$salt$hash` or `$3$salt$hash` string.
    Crypt(String),
    /// `NT`: MD4 of the UTF-16LE password.
    Nt([u8; 16]),
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a secret, even in a debug dump.
        f.write_str(match self {
            Password::Clear(_) => "CL:***",
            Password::Crypt(_) => "CR:***",
            Password::Nt(_) => "NT:***",
        })
    }
}

impl Password {
    /// Check `given` against the stored password. Err carries 3proxy's
    /// code for a wrong password of this kind: 6 CL, 7 CR, 8 NT.
    pub fn verify(&self, given: &str) -> Result<(), Res> {
        match self {
            Password::Clear(p) => ct_eq(p.as_bytes(), given.as_bytes())
                .then_some(())
                .ok_or(Res::AUTH_BAD_CL),
            Password::Crypt(c) => match crypt(given, c) {
                Some(made) if ct_eq(&made, c.as_bytes()) => Ok(()),
                _ => Err(Res::AUTH_BAD_CR),
            },
            Password::Nt(h) => ct_eq(&nt_hash(given), h)
                .then_some(())
                .ok_or(Res::AUTH_BAD_NT),
        }
    }
}

/// The `users` table: name → password. Later lines replace earlier
/// entries of the same name, as 3proxy's hash does.
#[derive(Debug, Clone, Default)]
pub struct Users {
    map: HashMap<String, Password>,
    /// A stored password of the costliest kind in the table (CR, then NT,
    /// then CL), checked in vain for a name the table lacks.
    decoy: Option<Password>,
}

impl Users {
    /// Add the entries of one `users` line (arguments after the command).
    /// `user:pass`, `user:CL:pass`, `user:CR:$1$...`, `user:NT:HEX`.
    /// As in 3proxy, two characters and a colon after the name are a type:
    /// `CL`, `CR` or `NT`, and an entry with any other type (`u:xy:pw`)
    /// is skipped, as is one without a colon. A malformed `NT` hash is
    /// an error. Ok carries what to warn about, if anything: one text for
    /// the line, however many entries it skips.
    pub fn add_line(&mut self, args: &[String]) -> Result<Option<String>, String> {
        let mut skipped: Vec<String> = Vec::new();
        for a in args {
            let Some((name, rest)) = a.split_once(':') else {
                skipped.push(format!("'{}' has no ':' and is skipped", quote(a)));
                continue;
            };
            let pw = match rest.as_bytes() {
                [_, _, b':', ..] => {
                    // Byte 2 is a ':', so byte 3 starts a character.
                    let value = &rest[3..];
                    match &rest.as_bytes()[..2] {
                        b"CL" => Password::Clear(value.to_string()),
                        b"CR" => {
                            if !value.starts_with("$1$") && !value.starts_with("$3$") {
                                skipped.push(format!(
                                    "{}: a CR password not in $1$ or $3$ form never matches",
                                    quote(name)
                                ));
                            }
                            Password::Crypt(value.to_string())
                        }
                        b"NT" => Password::Nt(parse_hex16(value).ok_or_else(|| {
                            format!("{}: an NT hash is 32 hex digits", quote(name))
                        })?),
                        t => {
                            skipped.push(format!(
                                "{}: unknown password type '{}', entry skipped",
                                quote(name),
                                quote(t)
                            ));
                            continue;
                        }
                    }
                }
                _ => Password::Clear(rest.to_string()),
            };
            let cost = |p: &Password| match p {
                Password::Clear(_) => 0,
                Password::Nt(_) => 1,
                Password::Crypt(_) => 2,
            };
            if self.decoy.as_ref().is_none_or(|d| cost(&pw) > cost(d)) {
                self.decoy = Some(pw.clone());
            }
            self.map.insert(name.to_string(), pw);
        }
        Ok(match skipped.len() {
            0 => None,
            1 => Some(skipped.remove(0)),
            n => Some(format!(
                "{} (and {} more entries skipped)",
                skipped[0],
                n - 1
            )),
        })
    }

    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<&Password> {
        self.map.get(name)
    }

    /// No `users` line gave an entry.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// 3proxy's `strongauth`: 4 no user name, 5 unknown user or no
    /// password, 6-8 wrong password.
    pub fn check(&self, user: Option<&str>, password: Option<&str>) -> Result<(), Res> {
        let user = user.ok_or(Res::AUTH_NO_USER)?;
        let password = password.ok_or(Res::AUTH_BAD_USER)?;
        match self.map.get(user) {
            Some(p) => p.verify(password),
            None => {
                // Do the work of a wrong password for the costliest kind
                // of entry in the table (an MD5-crypt if there is a CR
                // user), so that where all users have the same kind the
                // answer time does not tell which names exist. The
                // outcome is thrown away.
                if let Some(d) = &self.decoy {
                    let _ = std::hint::black_box(d.verify(password));
                }
                Err(Res::AUTH_BAD_USER)
            }
        }
    }
}

/// `authcache TYPES [TIME] [SIZE]`: what identifies a cached
/// authentication, for how long, and how many are kept (3proxy's
/// `authcachetype` bits, with its defaults: `user,password`, 600 s,
/// 262144 entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConf {
    pub kind: u32,
    pub secs: u64,
    pub size: usize,
}

impl CacheConf {
    pub const IP: u32 = 1;
    pub const USER: u32 = 2;
    pub const PASS: u32 = 4;
    /// With `ip`: the address is compared, not part of the key, so an
    /// entry serves only the address that made it (one address per user,
    /// per password, ...). Without `ip` it does nothing, as in 3proxy.
    pub const LIMIT: u32 = 8;
    pub const ACL: u32 = 16;
    /// A hit gives back the outgoing source address (`extip`) chosen when
    /// the entry was made.
    pub const EXT: u32 = 32;
    pub const DSTADDR: u32 = 64;
    pub const DSTPORT: u32 = 128;
    pub const DSTHOST: u32 = 256;
    pub const DSTOPER: u32 = 512;
    pub const SRVADDR: u32 = 1024;
    pub const SRVPORT: u32 = 2048;

    /// Parse `authcache`'s arguments. As in 3proxy, each key word is looked
    /// for anywhere in the first argument (`user,password` has `user` and
    /// `pass`), and 0 or nothing recognised means the default.
    pub fn parse(args: &[String]) -> Result<CacheConf, String> {
        const WORDS: &[(&str, u32)] = &[
            ("ip", CacheConf::IP),
            ("user", CacheConf::USER),
            ("pass", CacheConf::PASS),
            ("limit", CacheConf::LIMIT),
            ("acl", CacheConf::ACL),
            ("ext", CacheConf::EXT),
            ("dstaddr", CacheConf::DSTADDR),
            ("dstport", CacheConf::DSTPORT),
            ("dsthost", CacheConf::DSTHOST),
            ("dstoper", CacheConf::DSTOPER),
            ("srvaddr", CacheConf::SRVADDR),
            ("srvport", CacheConf::SRVPORT),
        ];
        let mut c = CacheConf::default();
        let kind = WORDS
            .iter()
            .filter(|(w, _)| args[0].contains(w))
            .fold(0, |k, (_, b)| k | b);
        if kind != 0 {
            c.kind = kind;
        }
        let num = |s: &String| {
            s.parse::<u64>()
                .map_err(|_| format!("'{}' is not a number", quote(s)))
        };
        match args.get(1).map(num).transpose()? {
            Some(0) | None => {}
            Some(t) => c.secs = t,
        }
        match args.get(2).map(num).transpose()? {
            Some(0) | None => {}
            Some(n) => c.size = usize::try_from(n).unwrap_or(usize::MAX),
        }
        Ok(c)
    }
}

impl Default for CacheConf {
    fn default() -> Self {
        CacheConf {
            kind: CacheConf::USER | CacheConf::PASS,
            secs: 600,
            size: 262144,
        }
    }
}

/// What a request offers the cache: the fields a cache type may key on.
#[derive(Debug, Clone, Copy, Default)]
pub struct CacheQuery<'a> {
    pub user: Option<&'a str>,
    pub password: Option<&'a str>,
    pub client: Option<std::net::IpAddr>,
    /// Identity of the service's ACL (`acl` key): one per service line
    /// with a non-empty ACL, 0 for all services without one (3proxy keys
    /// on its per-service copy of the list).
    pub acl: usize,
    pub dst: Option<std::net::IpAddr>,
    pub port: u16,
    pub host: Option<&'a str>,
    pub op: u32,
    /// The service's listening address (`srvaddr`, `srvport`; 3proxy's
    /// `intsa`): 0.0.0.0 for a service on every address.
    pub srv: Option<std::net::SocketAddr>,
    /// Seconds since the epoch.
    pub now: u64,
}

/// A cache hit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hit {
    /// The cached user name, when the type lacks `user`.
    pub user: Option<String>,
    /// With `ext`: a chain that makes the session's outgoing connection
    /// from the source address the entry was made with (one `extip` hop);
    /// None when the entry has none.
    pub route: Option<crate::parent::Parents>,
}

#[derive(Debug, Clone)]
struct Cached {
    user: String,
    client: Option<std::net::IpAddr>,
    /// `extip` source of the session that made the entry, as a chain.
    route: Option<crate::parent::Parents>,
    expires: u64,
    /// Position in the expiry queue.
    seq: u64,
}

#[derive(Debug, Default)]
struct Table {
    map: HashMap<[u8; 32], Cached>,
    /// Every entry of `map` by (expiry, insertion number): the ones that
    /// have expired are at the front.
    queue: std::collections::BTreeMap<(u64, u64), [u8; 32]>,
    seq: u64,
}

/// The authentication cache: process-wide, so it survives reloads, as in
/// 3proxy. Keys are BLAKE2b digests of the chosen fields, so no password
/// is kept in memory; a lookup is one hash-map probe, an insertion
/// O(log n) amortized (expired entries leave through an ordered queue,
/// each once).
#[derive(Debug, Default)]
pub struct AuthCache {
    table: std::sync::RwLock<Table>,
}

/// Whether any service uses `auth cache`/`cacheacl`; entries are only made
/// then (3proxy makes them always, for nobody to read).
pub static CACHE_IN_USE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl AuthCache {
    /// The process's cache.
    pub fn global() -> &'static AuthCache {
        static C: std::sync::OnceLock<AuthCache> = std::sync::OnceLock::new();
        C.get_or_init(AuthCache::default)
    }

    /// The key of a request, or None if it lacks a field the type needs.
    fn key(conf: &CacheConf, q: &CacheQuery<'_>) -> Option<[u8; 32]> {
        use blake2::digest::{Update, VariableOutput};
        let k = conf.kind;
        let mut h = blake2::Blake2bVar::new(32).ok()?;
        // Each field is length-prefixed, so no two requests share a key by
        // shifting bytes between fields.
        let mut put = |tag: u8, b: &[u8]| {
            h.update(&[tag]);
            h.update(&(b.len() as u32).to_le_bytes());
            h.update(b);
        };
        let ip_bytes = |a: std::net::IpAddr| match a.to_canonical() {
            std::net::IpAddr::V4(a) => a.octets().to_vec(),
            std::net::IpAddr::V6(a) => a.octets().to_vec(),
        };
        if k & CacheConf::USER != 0 {
            put(1, q.user?.as_bytes());
        }
        if k & CacheConf::PASS != 0 {
            put(2, q.password?.as_bytes());
        }
        if k & CacheConf::IP != 0 && k & CacheConf::LIMIT == 0 {
            put(3, &ip_bytes(q.client?));
        }
        if k & CacheConf::ACL != 0 {
            put(4, &q.acl.to_le_bytes());
        }
        if k & CacheConf::DSTADDR != 0 {
            put(5, &q.dst.map(ip_bytes).unwrap_or_default());
        }
        if k & CacheConf::DSTPORT != 0 {
            put(6, &q.port.to_le_bytes());
        }
        if k & CacheConf::DSTHOST != 0 {
            put(7, q.host.unwrap_or("").as_bytes());
        }
        if k & CacheConf::DSTOPER != 0 {
            put(8, &q.op.to_le_bytes());
        }
        if k & CacheConf::SRVADDR != 0 {
            put(9, &q.srv.map(|a| ip_bytes(a.ip())).unwrap_or_default());
        }
        if k & CacheConf::SRVPORT != 0 {
            put(10, &q.srv.map_or(0, |a| a.port()).to_le_bytes());
        }
        let mut out = [0u8; 32];
        h.finalize_variable(&mut out).ok()?;
        Some(out)
    }

    /// 3proxy's `cacheauth`: the hit (see [`Hit`]); Err 4 on a miss, 10
    /// when `ip,limit` finds the entry made from another address.
    pub fn lookup(&self, conf: &CacheConf, q: &CacheQuery<'_>) -> Result<Hit, Res> {
        if conf.kind & CacheConf::IP != 0 && q.client.is_none() {
            return Err(Res::AUTH_NO_USER);
        }
        let key = Self::key(conf, q).ok_or(Res::AUTH_NO_USER)?;
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let hit = table
            .map
            .get(&key)
            .filter(|c| c.expires > q.now)
            .ok_or(Res::AUTH_NO_USER)?;
        let limit = CacheConf::IP | CacheConf::LIMIT;
        if conf.kind & limit == limit
            && hit.client.map(|a| a.to_canonical()) != q.client.map(|a| a.to_canonical())
        {
            return Err(Res::QUOTA);
        }
        Ok(Hit {
            user: (conf.kind & CacheConf::USER == 0 && !hit.user.is_empty())
                .then(|| hit.user.clone()),
            route: if conf.kind & CacheConf::EXT != 0 {
                hit.route.clone()
            } else {
                None
            },
        })
    }

    /// Remember a successful authentication of `q.user`, made with the
    /// outgoing source address `source` (an `extip` choice) if any. A
    /// cache full of live entries takes no more.
    pub fn insert(&self, conf: &CacheConf, q: &CacheQuery<'_>, source: Option<std::net::IpAddr>) {
        let Some(user) = q.user else { return };
        let Some(key) = Self::key(conf, q) else {
            return;
        };
        let mut guard = self.table.write().unwrap_or_else(|e| e.into_inner());
        let t = &mut *guard;
        // Expired entries leave first: each is removed once, so this costs
        // O(log n) per insertion on average.
        while let Some(e) = t.queue.first_entry() {
            if e.key().0 > q.now {
                break;
            }
            let gone = e.remove();
            t.map.remove(&gone);
        }
        match t.map.get(&key) {
            Some(old) => {
                t.queue.remove(&(old.expires, old.seq));
            }
            None if t.map.len() >= conf.size => return,
            None => {}
        }
        t.seq += 1;
        let entry = Cached {
            user: user.to_string(),
            client: q.client,
            route: source.map(crate::parent::from_source),
            expires: q.now.saturating_add(conf.secs),
            seq: t.seq,
        };
        t.queue.insert((entry.expires, entry.seq), key);
        t.map.insert(key, entry);
    }

    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        let t = self.table.read().unwrap();
        (t.map.len(), t.queue.len())
    }
}

fn parse_hex16(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Compare in time that depends only on the lengths, not on where the
/// bytes differ (3proxy's `ctmemcmp`).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    // Keep the optimizer from ending the loop early on a difference.
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crypt(pw: &[u8], setting: &str) -> Option<String> {
        super::crypt(pw, setting).map(|v| String::from_utf8(v).unwrap())
    }

    fn users(line: &str) -> Users {
        let mut u = Users::default();
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        u.add_line(&args).unwrap();
        u
    }

    #[test]
    fn md5_crypt_known_hashes() {
        // Each made with `openssl passwd -1 -salt SALT PASSWORD`.
        let cases = [
            ("password", "$1$saltsalt$qjXMvbEw8oaL.CzflDtaK/"),
            ("secret", "$1$abc$iCQ2D3nhptRYi27fDYv2s1"),
            ("", "$1$$qRPK7m23GJusamGpoGLby/"),
            ("hunter2 with spaces", "$1$Xy7.q/Z0$2x4gU5aCGiNuw6pKHCOqf."),
        ];
        for (pw, want) in cases {
            assert_eq!(crypt(pw.as_bytes(), want).as_deref(), Some(want), "{pw}");
            let u = users(&format!("u:CR:{want}"));
            assert!(u.check(Some("u"), Some(pw)).is_ok(), "{pw}");
        }
        // Only the `$1$salt$` head of the setting counts.
        assert_eq!(
            crypt(b"secret", "$1$abc$").unwrap(),
            crypt(b"secret", "$1$abc$whatever").unwrap()
        );
    }

    #[test]
    fn blake2_crypt_as_3proxy_crypt_makes_it() {
        // Each printed by 3proxy's own `3proxy_crypt SALT PASSWORD`.
        assert_eq!(
            crypt(b"password", "$3$salt$").as_deref(),
            Some("$3$salt$yCFxAkLdiC9UiJY4yH5Qm/")
        );
        let s = "$3$Sa1t.Long/xyz$SbMNN38qBHtqfTefLBUcb0";
        assert_eq!(crypt("p\u{e4}ssword".as_bytes(), s).as_deref(), Some(s));
        let u = users("bob:CR:$3$salt$yCFxAkLdiC9UiJY4yH5Qm/");
        assert!(u.check(Some("bob"), Some("password")).is_ok());
        assert_eq!(u.check(Some("bob"), Some("passwore")), Err(Res(7)));
    }

    #[test]
    fn nt_hash_known_value() {
        // As `3proxy_crypt password` prints it.
        let h = nt_hash("password");
        assert_eq!(h, parse_hex16("8846F7EAEE8FB117AD06BDD830B7586C").unwrap());
        let u =
            users("w:NT:8846F7EAEE8FB117AD06BDD830B7586C l:NT:8846f7eaee8fb117ad06bdd830b7586c");
        assert!(u.check(Some("w"), Some("password")).is_ok());
        assert!(u.check(Some("l"), Some("password")).is_ok());
        assert_eq!(u.check(Some("w"), Some("Password")), Err(Res(8)));
    }

    #[test]
    fn users_line_forms() {
        let u = users(
            "a:pa b:CL:pb c:CR:$1$saltsalt$qjXMvbEw8oaL.CzflDtaK/ noColon d:XX:skipped e: f:a:b \
             g:xy:pw h:C1:pw i:cl:pw j::x:pw",
        );
        assert_eq!(u.len(), 5);
        // Two characters and a colon are a type; only CL, CR and NT are
        // known (3proxy skips the rest, lowercase too).
        for skipped in ["g", "h", "i", "j"] {
            assert!(u.get(skipped).is_none(), "{skipped}");
        }
        assert!(u.check(Some("a"), Some("pa")).is_ok());
        assert!(u.check(Some("b"), Some("pb")).is_ok());
        assert!(u.check(Some("c"), Some("password")).is_ok());
        assert!(u.check(Some("e"), Some("")).is_ok());
        // "a:b" is not a type (lowercase): the whole rest is the password.
        assert!(u.check(Some("f"), Some("a:b")).is_ok());
        assert!(u.get("d").is_none());
        assert!(u.get("noColon").is_none());
    }

    #[test]
    fn strong_codes() {
        let u = users("a:pa c:CR:$1$saltsalt$qjXMvbEw8oaL.CzflDtaK/ x:CR:plain");
        assert_eq!(u.check(None, Some("pa")), Err(Res(4)));
        assert_eq!(u.check(Some("a"), None), Err(Res(5)));
        assert_eq!(u.check(Some("zz"), Some("pa")), Err(Res(5)));
        assert_eq!(u.check(Some("a"), Some("pb")), Err(Res(6)));
        assert_eq!(u.check(Some("a"), Some("pa ")), Err(Res(6)));
        assert_eq!(u.check(Some("c"), Some("passwor")), Err(Res(7)));
        assert_eq!(u.check(Some("x"), Some("plain")), Err(Res(7)));
    }

    #[test]
    fn unknown_users_are_checked_against_the_costliest_entry() {
        let kind = |line: &str| users(line).decoy.map(|d| format!("{d:?}"));
        assert_eq!(kind(""), None);
        assert_eq!(kind("a:pa").as_deref(), Some("CL:***"));
        let nt = "n:NT:8846F7EAEE8FB117AD06BDD830B7586C";
        assert_eq!(kind(&format!("a:pa {nt} b:pb")).as_deref(), Some("NT:***"));
        let cr = "c:CR:$1$saltsalt$qjXMvbEw8oaL.CzflDtaK/";
        assert_eq!(kind(&format!("a:pa {cr} {nt}")).as_deref(), Some("CR:***"));
        // The password of the decoy's own user does not let a stranger in.
        let u = users(&format!("a:pa {cr}"));
        assert_eq!(u.check(Some("zz"), Some("password")), Err(Res(5)));
    }

    #[test]
    fn bad_nt_hash_is_an_error() {
        let mut u = Users::default();
        assert!(u.add_line(&["n:NT:1234".to_string()]).is_err());
    }

    #[test]
    fn later_entries_replace_earlier() {
        let u = users("a:one a:two");
        assert_eq!(u.check(Some("a"), Some("one")), Err(Res(6)));
        assert!(u.check(Some("a"), Some("two")).is_ok());
    }

    #[test]
    fn constant_time_compare() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(!ct_eq(b"", b"\0"));
        assert!(ct_eq(b"", b""));
    }

    #[test]
    fn authcache_types() {
        let parse = |s: &str| CacheConf::parse(&s.split(' ').map(String::from).collect::<Vec<_>>());
        assert_eq!(
            parse("user,password").unwrap().kind,
            CacheConf::USER | CacheConf::PASS
        );
        assert_eq!(
            parse("ip").unwrap(),
            CacheConf {
                kind: CacheConf::IP,
                secs: 600,
                size: 262144
            }
        );
        assert_eq!(
            parse("ip,user 60 100").unwrap(),
            CacheConf {
                kind: 3,
                secs: 60,
                size: 100
            }
        );
        assert_eq!(parse("nothing").unwrap().kind, 6);
        let all = "ip,user,limit,acl,ext,dstaddr,dstport,dsthost,dstoper,srvaddr,srvport";
        assert_eq!(parse(all).unwrap().kind, 0xffb);
        // `limit` goes with anything, as in 3proxy.
        assert_eq!(parse("limit,user").unwrap().kind, 10);
        assert_eq!(parse("limit").unwrap().kind, 8);
        assert!(parse("ip 1x").is_err());
    }

    fn cq<'a>(user: Option<&'a str>, pw: Option<&'a str>, ip: &str, now: u64) -> CacheQuery<'a> {
        CacheQuery {
            user,
            password: pw,
            client: Some(ip.parse().unwrap()),
            now,
            ..CacheQuery::default()
        }
    }

    fn conf(kind: u32, secs: u64, size: usize) -> CacheConf {
        CacheConf { kind, secs, size }
    }

    /// A plain hit: no user name given back, no route.
    fn plain() -> Result<Hit, Res> {
        Ok(Hit::default())
    }

    #[test]
    fn authcache_user_password_and_expiry() {
        let c = AuthCache::default();
        let conf = conf(CacheConf::USER | CacheConf::PASS, 60, 10);
        assert_eq!(
            c.lookup(&conf, &cq(Some("a"), Some("pw"), "10.0.0.1", 100)),
            Err(Res(4))
        );
        c.insert(&conf, &cq(Some("a"), Some("pw"), "10.0.0.1", 100), None);
        assert_eq!(
            c.lookup(&conf, &cq(Some("a"), Some("pw"), "10.0.0.9", 159)),
            plain()
        );
        assert_eq!(
            c.lookup(&conf, &cq(Some("a"), Some("bad"), "10.0.0.1", 101)),
            Err(Res(4))
        );
        assert_eq!(
            c.lookup(&conf, &cq(None, Some("pw"), "10.0.0.1", 101)),
            Err(Res(4))
        );
        assert_eq!(
            c.lookup(&conf, &cq(Some("a"), Some("pw"), "10.0.0.1", 160)),
            Err(Res(4)),
            "expired"
        );
    }

    #[test]
    fn authcache_by_ip_supplies_the_user() {
        let c = AuthCache::default();
        let conf = conf(CacheConf::IP, 60, 10);
        c.insert(&conf, &cq(Some("alice"), Some("pw"), "10.0.0.1", 0), None);
        assert_eq!(
            c.lookup(&conf, &cq(None, None, "10.0.0.1", 1))
                .unwrap()
                .user,
            Some("alice".into())
        );
        assert_eq!(c.lookup(&conf, &cq(None, None, "10.0.0.2", 1)), Err(Res(4)));
    }

    #[test]
    fn authcache_limit_pins_a_user_to_one_address() {
        let c = AuthCache::default();
        let conf = conf(CacheConf::IP | CacheConf::USER | CacheConf::LIMIT, 60, 10);
        c.insert(&conf, &cq(Some("a"), None, "10.0.0.1", 0), None);
        assert_eq!(
            c.lookup(&conf, &cq(Some("a"), None, "10.0.0.1", 1)),
            plain()
        );
        assert_eq!(
            c.lookup(&conf, &cq(Some("a"), None, "10.0.0.2", 1)),
            Err(Res(10))
        );
        // Another user is just a miss.
        assert_eq!(
            c.lookup(&conf, &cq(Some("b"), None, "10.0.0.2", 1)),
            Err(Res(4))
        );
    }

    #[test]
    fn authcache_limit_in_any_combination() {
        // `ip,password,limit`: a password serves one address at a time.
        let c = AuthCache::default();
        let k = CacheConf::IP | CacheConf::PASS | CacheConf::LIMIT;
        let parsed = CacheConf::parse(&["ip,password,limit".to_string()]).unwrap();
        assert_eq!(parsed.kind, k);
        let conf = conf(k, 60, 10);
        c.insert(&conf, &cq(Some("a"), Some("pw"), "10.0.0.1", 0), None);
        assert_eq!(
            c.lookup(&conf, &cq(None, Some("pw"), "10.0.0.1", 1))
                .unwrap()
                .user,
            Some("a".into())
        );
        assert_eq!(
            c.lookup(&conf, &cq(None, Some("pw"), "10.0.0.2", 1)),
            Err(Res(10))
        );
        // `user,limit` without `ip`: `limit` does nothing, any address hits.
        let c = AuthCache::default();
        let k = CacheConf::USER | CacheConf::LIMIT;
        assert_eq!(
            CacheConf::parse(&["user,limit".to_string()]).unwrap().kind,
            k
        );
        let conf = self::conf(k, 60, 10);
        c.insert(&conf, &cq(Some("a"), None, "10.0.0.1", 0), None);
        assert_eq!(
            c.lookup(&conf, &cq(Some("a"), None, "10.0.0.2", 1)),
            plain()
        );
        // `ip,limit` alone: the key is empty, one entry for everybody,
        // owned by the last address that authenticated.
        let c = AuthCache::default();
        let conf = self::conf(CacheConf::IP | CacheConf::LIMIT, 60, 10);
        c.insert(&conf, &cq(Some("a"), None, "10.0.0.1", 0), None);
        c.insert(&conf, &cq(Some("b"), None, "10.0.0.2", 0), None);
        assert_eq!(
            c.lookup(&conf, &cq(None, None, "10.0.0.2", 1))
                .unwrap()
                .user,
            Some("b".into())
        );
        assert_eq!(
            c.lookup(&conf, &cq(None, None, "10.0.0.1", 1)),
            Err(Res(10))
        );
    }

    #[test]
    fn authcache_key_fields_separate_entries() {
        let base = CacheQuery {
            user: Some("u"),
            client: Some("10.0.0.1".parse().unwrap()),
            acl: 7,
            dst: Some("192.0.2.1".parse().unwrap()),
            port: 80,
            host: Some("example.org"),
            op: 0x100,
            srv: Some("127.0.0.1:3128".parse().unwrap()),
            now: 1,
            ..CacheQuery::default()
        };
        // Each field, with the request that differs from `base` in it.
        let cases: [(u32, CacheQuery<'_>); 7] = [
            (CacheConf::ACL, CacheQuery { acl: 8, ..base }),
            (
                CacheConf::DSTADDR,
                CacheQuery {
                    dst: Some("192.0.2.2".parse().unwrap()),
                    ..base
                },
            ),
            (CacheConf::DSTPORT, CacheQuery { port: 443, ..base }),
            (
                CacheConf::DSTHOST,
                CacheQuery {
                    host: Some("example.com"),
                    ..base
                },
            ),
            (CacheConf::DSTOPER, CacheQuery { op: 0x200, ..base }),
            (
                CacheConf::SRVADDR,
                CacheQuery {
                    srv: Some("127.0.0.2:3128".parse().unwrap()),
                    ..base
                },
            ),
            (
                CacheConf::SRVPORT,
                CacheQuery {
                    srv: Some("127.0.0.1:8080".parse().unwrap()),
                    ..base
                },
            ),
        ];
        for (i, (bit, other)) in cases.iter().enumerate() {
            let c = AuthCache::default();
            let conf = conf(CacheConf::IP | bit, 60, 10);
            c.insert(&conf, &base, None);
            assert_eq!(
                c.lookup(&conf, &base).unwrap().user,
                Some("u".into()),
                "{bit:#x}"
            );
            assert_eq!(
                c.lookup(&conf, other),
                Err(Res(4)),
                "{bit:#x} tells them apart"
            );
            // A field the type leaves out does not count.
            for (j, (_, unrelated)) in cases.iter().enumerate() {
                if j != i {
                    assert!(
                        c.lookup(&conf, unrelated).is_ok(),
                        "{bit:#x} ignores case {j}"
                    );
                }
            }
        }
    }

    #[test]
    fn authcache_ext_gives_back_the_source() {
        let c = AuthCache::default();
        let src: std::net::IpAddr = "2001:db8::1234".parse().unwrap();
        let with_ext = conf(CacheConf::IP | CacheConf::EXT, 60, 10);
        c.insert(&with_ext, &cq(Some("a"), None, "10.0.0.1", 0), Some(src));
        let route = c
            .lookup(&with_ext, &cq(None, None, "10.0.0.1", 1))
            .unwrap()
            .route
            .expect("a route");
        assert_eq!(route.len(), 1);
        assert_eq!(route[0].kind, crate::parent::Kind::ExtIp);
        assert_eq!(route[0].addr.ip(), src);
        // The same route each time (a kept HTTP connection compares it).
        let again = c.lookup(&with_ext, &cq(None, None, "10.0.0.1", 2)).unwrap();
        assert!(std::sync::Arc::ptr_eq(&route, &again.route.unwrap()));
        // Without `ext` in the type nothing is given back; an entry made
        // without a source gives none.
        let no_ext = conf(CacheConf::IP, 60, 10);
        c.insert(&no_ext, &cq(Some("a"), None, "10.0.0.2", 0), Some(src));
        assert_eq!(
            c.lookup(&no_ext, &cq(None, None, "10.0.0.2", 1))
                .unwrap()
                .route,
            None
        );
        c.insert(&with_ext, &cq(Some("b"), None, "10.0.0.3", 0), None);
        assert_eq!(
            c.lookup(&with_ext, &cq(None, None, "10.0.0.3", 1))
                .unwrap()
                .route,
            None
        );
    }

    #[test]
    fn authcache_size_is_bounded() {
        let c = AuthCache::default();
        let conf = conf(CacheConf::USER, 10, 2);
        for u in ["a", "b", "c"] {
            c.insert(&conf, &cq(Some(u), None, "10.0.0.1", 0), None);
        }
        assert_eq!(
            c.lookup(&conf, &cq(Some("c"), None, "10.0.0.1", 1)),
            Err(Res(4)),
            "full"
        );
        // Once the old ones expire they make room.
        c.insert(&conf, &cq(Some("c"), None, "10.0.0.1", 20), None);
        assert_eq!(
            c.lookup(&conf, &cq(Some("c"), None, "10.0.0.1", 21)),
            plain()
        );
    }

    #[test]
    fn authcache_expired_entries_leave_and_renewals_move() {
        let c = AuthCache::default();
        let short = conf(CacheConf::USER, 10, 1000);
        let long = conf(CacheConf::USER, 100, 1000);
        let names: Vec<String> = (0..200).map(|i| format!("u{i}")).collect();
        for (i, n) in names.iter().enumerate() {
            let conf = if i % 2 == 0 { &short } else { &long };
            c.insert(conf, &cq(Some(n), None, "10.0.0.1", 0), None);
        }
        assert_eq!(c.len(), (200, 200));
        // Renewing an entry moves it in the queue, not a second copy.
        c.insert(&long, &cq(Some("u0"), None, "10.0.0.1", 5), None);
        assert_eq!(c.len(), (200, 200));
        // At 10 the 99 short ones left are gone, u0 (renewed) stays.
        c.insert(&long, &cq(Some("new"), None, "10.0.0.1", 10), None);
        assert_eq!(c.len(), (102, 102));
        assert_eq!(
            c.lookup(&long, &cq(Some("u0"), None, "10.0.0.1", 11)),
            plain()
        );
        assert_eq!(
            c.lookup(&long, &cq(Some("u2"), None, "10.0.0.1", 11)),
            Err(Res(4))
        );
        assert_eq!(
            c.lookup(&long, &cq(Some("u1"), None, "10.0.0.1", 11)),
            plain()
        );
        c.insert(&long, &cq(Some("last"), None, "10.0.0.1", 200), None);
        assert_eq!(c.len(), (1, 1));
    }

    #[test]
    fn auth_types() {
        assert_eq!(AuthType::parse("iponly"), Ok(AuthType::IpOnly));
        assert_eq!(AuthType::parse("dnsname"), Ok(AuthType::DnsName));
        assert_eq!(AuthType::parse("radius"), Ok(AuthType::Radius));
        assert!(AuthType::parse("bogus").unwrap_err().contains("unknown"));
    }
}
