//! ACL rules and their matching (3proxy's acl.c `ACLmatches`/`checkACL`,
//! conf.c `make_ace`/`scanipl`; 3proxy.cfg(5) `allow`, `deny`).
//!
//! A rule has seven fields, each a list or `*` (any): users, source
//! addresses, destination addresses and host names, ports, operations,
//! weekdays and time periods. The same rule syntax selects the sessions of
//! `allow`/`deny` and of the limit commands (`bandlimin`, `connlim`, ...).
//!
//! Invariants: parsing is pure (no IO, no name resolution); matching takes
//! an immutable rule and a [`Query`] and costs O(log n) or O(1) per field
//! for big lists, never a scan of the list: addresses and ports are sorted,
//! merged ranges found by binary search, users and host patterns are hash
//! sets (host patterns grouped by length, so a host of length L costs at
//! most one lookup per distinct pattern length and position).

use crate::conf::token::quote;
use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

/// An operation a client asks for, as the ACL's operation field names it.
/// The bit values are 3proxy's (structures.h), so masks combine alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpBits(pub u32);

impl OpBits {
    pub const CONNECT: u32 = 0x1;
    pub const BIND: u32 = 0x2;
    pub const UDPASSOC: u32 = 0x4;
    pub const ICMPASSOC: u32 = 0x8;
    pub const HTTP_GET: u32 = 0x100;
    pub const HTTP_PUT: u32 = 0x200;
    pub const HTTP_POST: u32 = 0x400;
    pub const HTTP_HEAD: u32 = 0x800;
    pub const HTTP_CONNECT: u32 = 0x1000;
    pub const HTTP_OTHER: u32 = 0x8000;
    /// Every HTTP operation but CONNECT.
    pub const HTTP: u32 = 0xEF00;
    pub const FTP_GET: u32 = 0x10000;
    pub const FTP_PUT: u32 = 0x20000;
    pub const FTP_LIST: u32 = 0x40000;
    pub const FTP_DATA: u32 = 0x80000;
    pub const FTP: u32 = 0xF0000;
    pub const DNSRESOLVE: u32 = 0x100000;
    pub const ADMIN: u32 = 0x1000000;

    /// The names accepted in the operation field.
    const NAMES: &'static [(&'static str, u32)] = &[
        ("CONNECT", Self::CONNECT),
        ("BIND", Self::BIND),
        ("UDPASSOC", Self::UDPASSOC),
        ("ICMPASSOC", Self::ICMPASSOC),
        ("HTTP_GET", Self::HTTP_GET),
        ("HTTP_PUT", Self::HTTP_PUT),
        ("HTTP_POST", Self::HTTP_POST),
        ("HTTP_HEAD", Self::HTTP_HEAD),
        ("HTTP_OTHER", Self::HTTP_OTHER),
        ("HTTP_CONNECT", Self::HTTP_CONNECT),
        ("HTTP", Self::HTTP),
        ("HTTPS", Self::HTTP_CONNECT),
        ("FTP_GET", Self::FTP_GET),
        ("FTP_PUT", Self::FTP_PUT),
        ("FTP_LIST", Self::FTP_LIST),
        ("FTP_DATA", Self::FTP_DATA),
        ("FTP", Self::FTP),
        ("ADMIN", Self::ADMIN),
        ("DNSRESOLVE", Self::DNSRESOLVE),
    ];
}

/// What a matching `allow`/`deny` entry does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
}

/// One access-control entry (3proxy's `struct ace`): an action, the rule
/// that selects requests, and the `nolog`/`weight` modifiers.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub action: Action,
    pub rule: Rule,
    /// `nolog`: matching requests are not logged.
    pub nolog: bool,
    /// `parent` lines after an `allow` (or `redirect`): the chain the
    /// allowed requests go through.
    pub parents: crate::parent::Parents,
}

/// The seven fields of a rule, plus its weight. `None` means `*`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rule {
    pub users: Option<HashSet<String>>,
    pub src: Option<IpSet>,
    /// Destination addresses; `names` holds the destination tokens that are
    /// not addresses. The destination field is one list in the cfg.
    pub dst: Option<IpSet>,
    pub names: Option<NameSet>,
    pub ports: Option<PortSet>,
    /// Mask of [`OpBits`].
    pub ops: Option<u32>,
    /// Bit n = weekday n (0 = Sunday).
    pub wdays: Option<u8>,
    /// Periods in seconds since local midnight, end exclusive.
    pub periods: Option<Vec<(u32, u32)>>,
    /// The 8th field or `weight N`: 0 means none.
    pub weight: u32,
}

/// Everything a rule is matched against: what the client asked for and
/// when. Built once per request by `access`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Query<'a> {
    /// The user name, None for an unauthenticated request (matched as `-`).
    pub user: Option<&'a str>,
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    /// Destination host, lowercase, without trailing dots.
    pub host: Option<&'a str>,
    pub port: u16,
    /// One of [`OpBits`], or 0 if the service has no notion of operation.
    pub op: u32,
    /// Weekday of the session start, 0 = Sunday.
    pub wday: u8,
    /// Seconds since local midnight at the session start.
    pub daysec: u32,
    /// The request's current weight (set by the last matching entry).
    pub weight: u32,
    /// The client came through a local redirection
    /// (`parent::skip_on_redirect`).
    pub redirected: bool,
}

impl Rule {
    /// Whether a request matches the rule by its client's address (and
    /// the time) alone: every other field is `*`. Such `connlim` rules
    /// are decided when a connection is accepted (`limit::ConnHold`).
    pub fn by_source_only(&self) -> bool {
        self.users.is_none()
            && self.dst.is_none()
            && self.names.is_none()
            && self.ports.is_none()
            && self.ops.is_none()
    }

    /// Parse the seven rule fields (and an optional 8th, the weight) of
    /// `allow`, `deny` and the limit commands. Missing trailing fields are
    /// `*`.
    pub fn parse(fields: &[String]) -> Result<Rule, String> {
        let mut r = Rule::default();
        let field = |i: usize| fields.get(i).map(String::as_str).filter(|s| *s != "*");
        if let Some(f) = field(0) {
            r.users = Some(
                f.split(',')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect(),
            );
        }
        if let Some(f) = field(1) {
            let mut set = IpSetBuilder::default();
            for tok in f.split(',').filter(|s| !s.is_empty()) {
                match parse_ip_range(tok)? {
                    Some((a, b)) => set.push(a, b),
                    None => {
                        return Err(format!(
                            "'{}' is not an IP address, range or CIDR",
                            quote(tok)
                        ))
                    }
                }
            }
            r.src = Some(set.build());
        }
        if let Some(f) = field(2) {
            let mut set = IpSetBuilder::default();
            let mut names = NameSet::default();
            let (mut any_ip, mut any_name) = (false, false);
            for tok in f.split(',').filter(|s| !s.is_empty()) {
                match parse_ip_range(tok)? {
                    Some((a, b)) => {
                        set.push(a, b);
                        any_ip = true;
                    }
                    None => {
                        names.insert(tok);
                        any_name = true;
                    }
                }
            }
            if any_ip {
                r.dst = Some(set.build());
            }
            if any_name {
                r.names = Some(names);
            }
        }
        if let Some(f) = field(3) {
            r.ports = Some(PortSet::parse(f)?);
        }
        if let Some(f) = field(4) {
            let mut mask = 0;
            for tok in f.split(',').filter(|s| !s.is_empty()) {
                match OpBits::NAMES.iter().find(|(n, _)| *n == tok) {
                    Some((_, b)) => mask |= b,
                    None => return Err(format!("unknown operation '{}'", quote(tok))),
                }
            }
            r.ops = Some(mask);
        }
        if let Some(f) = field(5) {
            r.wdays = Some(parse_wdays(f)?);
        }
        if let Some(f) = field(6) {
            r.periods = Some(parse_periods(f)?);
        }
        if let Some(w) = fields.get(7) {
            r.weight = w
                .parse()
                .map_err(|_| format!("'{}' is not a weight (a number)", quote(w)))?;
        }
        if fields.len() > 8 {
            return Err(format!(
                "unexpected argument '{}' after the weight",
                quote(&fields[8])
            ));
        }
        Ok(r)
    }

    /// The rule looks at the weekday or the time of day.
    pub fn timed(&self) -> bool {
        self.wdays.is_some() || self.periods.is_some()
    }

    /// Whether the rule selects the request (3proxy's `ACLmatches`).
    ///
    /// The destination field is checked only when the request has what it
    /// lists: an address (or is a BIND) for address entries, a host name
    /// for name entries. The port field is checked only when the request
    /// has a port (or is a BIND). A request with neither passes the field.
    pub fn matches(&self, q: &Query<'_>) -> bool {
        if let Some(src) = &self.src {
            if !q.src.is_some_and(|a| src.contains(a)) {
                return false;
            }
        }
        let bind = q.op == OpBits::BIND;
        let check_ip = self.dst.is_some() && (q.dst.is_some() || bind);
        let check_name = self.names.is_some() && q.host.is_some();
        if check_ip || check_name {
            let ip_ok = check_ip
                && q.dst
                    .is_some_and(|a| self.dst.as_ref().is_some_and(|d| d.contains(a)));
            let name_ok = !ip_ok
                && check_name
                && q.host
                    .is_some_and(|h| self.names.as_ref().is_some_and(|n| n.matches(h)));
            if !ip_ok && !name_ok {
                return false;
            }
        }
        if let Some(ports) = &self.ports {
            if (q.port != 0 || bind) && !ports.contains(q.port) {
                return false;
            }
        }
        if let Some(w) = self.wdays {
            if w & (1 << (q.wday % 7)) == 0 {
                return false;
            }
        }
        if let Some(periods) = &self.periods {
            if !periods.iter().any(|&(a, b)| q.daysec >= a && q.daysec < b) {
                return false;
            }
        }
        if let Some(users) = &self.users {
            if !users.contains(q.user.unwrap_or("-")) {
                return false;
            }
        }
        if let Some(ops) = self.ops {
            if ops & q.op != q.op {
                return false;
            }
        }
        if self.weight != 0 && self.weight < q.weight {
            return false;
        }
        true
    }
}

/// Outcome of walking an ACL (3proxy's `checkACL` return values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The ACL is empty: allow all.
    Empty,
    /// Entry `i` matched.
    Matched(usize),
    /// A non-empty ACL with no match: the implicit `deny *`.
    NoMatch,
}

/// Walk the entries in order; the first match wins.
pub fn check(acl: &[Entry], q: &Query<'_>) -> Verdict {
    if acl.is_empty() {
        return Verdict::Empty;
    }
    // An entry with parents cannot serve a BIND (or any operation below
    // 256 but CONNECT and UDPASSOC): 3proxy skips it for those.
    let chainable = chainable(q);
    // (`crate::parent::skip_on_redirect`: 3proxy's second-pass rule.)
    let usable = |e: &Entry| {
        (chainable || e.parents.is_empty())
            && !crate::parent::skip_on_redirect(&e.parents, q.redirected)
    };
    match acl.iter().position(|e| usable(e) && e.rule.matches(q)) {
        Some(i) => Verdict::Matched(i),
        None => Verdict::NoMatch,
    }
}

fn chainable(q: &Query<'_>) -> bool {
    q.op >= 0x100 || q.op & (OpBits::CONNECT | OpBits::UDPASSOC) != 0
}

/// An index over an ACL that finds the first matching entry without
/// walking the whole list: the answer is always the one [`check`] gives.
///
/// Each entry is filed under one field it requires: its source addresses
/// (in a stabbing structure per family), else its user names (a hash map
/// from name to entries), else in the list of entries checked for every
/// request. A request looks up only the entries filed under its own source
/// address and user name, plus that list, and takes the first one (in cfg
/// order) that fully matches. With 10 000 `allow * CIDR` lines that is a
/// bisection and a handful of candidates instead of 10 000 checks.
///
/// Small ACLs (under [`Index::MIN_ENTRIES`]) are not indexed: walking them
/// is cheaper than the lookups.
#[derive(Debug, Default)]
pub struct Index {
    enabled: bool,
    by_user: std::collections::HashMap<String, Vec<u32>>,
    src4: Stab<u32>,
    src6: Stab<u128>,
    /// Entries with neither a source nor a user list, in cfg order.
    rest: Vec<u32>,
}

impl Index {
    /// ACLs shorter than this are walked.
    pub const MIN_ENTRIES: usize = 16;

    /// Whether lookups go through the index (the ACL is long enough).
    #[cfg(test)]
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn build(acl: &[Entry]) -> Index {
        if acl.len() < Self::MIN_ENTRIES {
            return Index::default();
        }
        Self::build_always(acl)
    }

    fn build_always(acl: &[Entry]) -> Index {
        let mut ix = Index {
            enabled: true,
            ..Index::default()
        };
        let (mut r4, mut r6) = (Vec::new(), Vec::new());
        for (i, e) in acl.iter().enumerate() {
            let id = i as u32;
            if let Some(src) = &e.rule.src {
                r4.extend(src.v4.iter().map(|&(a, b)| (a, b, id)));
                r6.extend(src.v6.iter().map(|&(a, b)| (a, b, id)));
            } else if let Some(users) = &e.rule.users {
                for u in users {
                    ix.by_user.entry(u.clone()).or_default().push(id);
                }
            } else {
                ix.rest.push(id);
            }
        }
        ix.src4 = Stab::build(r4);
        ix.src6 = Stab::build(r6);
        ix
    }

    /// The first entry of `acl` (the list this index was built from) that
    /// `ok` accepts, among those that can match `q`.
    fn first(&self, q: &Query<'_>, ok: impl Fn(usize) -> bool) -> Option<usize> {
        let mut best = usize::MAX;
        let mut scan = |ids: &mut dyn Iterator<Item = u32>| {
            for id in ids {
                let id = id as usize;
                if id >= best {
                    break;
                }
                if ok(id) {
                    best = id;
                    break;
                }
            }
        };
        if let Some(src) = q.src {
            let mut ids = Vec::new();
            match src.to_canonical() {
                IpAddr::V4(a) => self.src4.stab(u32::from(a), &mut ids),
                IpAddr::V6(a) => self.src6.stab(u128::from(a), &mut ids),
            }
            ids.sort_unstable();
            scan(&mut ids.into_iter());
        }
        if let Some(ids) = self.by_user.get(q.user.unwrap_or("-")) {
            scan(&mut ids.iter().copied());
        }
        scan(&mut self.rest.iter().copied());
        (best != usize::MAX).then_some(best)
    }
}

/// Which intervals contain a point, in O(log n + k): the intervals' ends
/// cut the line into elementary pieces, and a segment tree over the pieces
/// (bottom-up, any number of leaves) files each interval under the
/// O(log n) nodes that cover it exactly. A point's candidates are the
/// lists on the path from its piece to the root.
#[derive(Debug, Default)]
struct Stab<T> {
    /// Where each piece starts, ascending; the last runs to the maximum.
    starts: Vec<T>,
    nodes: Vec<Vec<u32>>,
}

impl<T: Ord + Copy + num_like::Succ> Stab<T> {
    fn build(ranges: Vec<(T, T, u32)>) -> Stab<T> {
        let mut starts: Vec<T> = Vec::with_capacity(ranges.len() * 2);
        for &(lo, hi, _) in &ranges {
            starts.push(lo);
            if let Some(next) = hi.succ() {
                starts.push(next);
            }
        }
        starts.sort_unstable();
        starts.dedup();
        let n = starts.len();
        let mut nodes = vec![Vec::new(); 2 * n];
        for (lo, hi, id) in ranges {
            // Pieces [a, b) of this range.
            let a = starts.partition_point(|&s| s < lo);
            let b = match hi.succ() {
                Some(next) => starts.partition_point(|&s| s < next),
                None => n,
            };
            let (mut l, mut r) = (a + n, b + n);
            while l < r {
                if l & 1 == 1 {
                    nodes[l].push(id);
                    l += 1;
                }
                if r & 1 == 1 {
                    r -= 1;
                    nodes[r].push(id);
                }
                l >>= 1;
                r >>= 1;
            }
        }
        for v in &mut nodes {
            v.shrink_to_fit();
        }
        Stab { starts, nodes }
    }

    /// Append the ids of the intervals that contain `x`.
    fn stab(&self, x: T, out: &mut Vec<u32>) {
        let piece = self.starts.partition_point(|&s| s <= x);
        if piece == 0 {
            return;
        }
        let mut i = piece - 1 + self.starts.len();
        while i >= 1 {
            out.extend_from_slice(&self.nodes[i]);
            i >>= 1;
        }
    }
}

/// [`check`] through an index built from the same list.
pub fn check_indexed(acl: &[Entry], index: &Index, q: &Query<'_>) -> Verdict {
    if !index.enabled {
        return check(acl, q);
    }
    if acl.is_empty() {
        return Verdict::Empty;
    }
    let chainable = chainable(q);
    let ok = |i: usize| {
        let e = &acl[i];
        (chainable || e.parents.is_empty())
            && !crate::parent::skip_on_redirect(&e.parents, q.redirected)
            && e.rule.matches(q)
    };
    match index.first(q, ok) {
        Some(i) => Verdict::Matched(i),
        None => Verdict::NoMatch,
    }
}

/// A set of address ranges of both families: sorted, merged, searched by
/// bisection. IPv4 addresses are kept apart from IPv6 ones: an entry
/// matches only addresses of its own family (an IPv4-mapped IPv6 address
/// counts as IPv4).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpSet {
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
}

impl IpSet {
    pub fn contains(&self, a: IpAddr) -> bool {
        match a.to_canonical() {
            IpAddr::V4(a) => in_ranges(&self.v4, u32::from(a)),
            IpAddr::V6(a) => in_ranges(&self.v6, u128::from(a)),
        }
    }
}

fn in_ranges<T: Ord + Copy>(r: &[(T, T)], x: T) -> bool {
    // The first range that ends at or after x is the only candidate.
    let i = r.partition_point(|&(_, hi)| hi < x);
    r.get(i).is_some_and(|&(lo, _)| lo <= x)
}

#[derive(Default)]
struct IpSetBuilder {
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
}

impl IpSetBuilder {
    fn push(&mut self, a: IpAddr, b: IpAddr) {
        match (a, b) {
            (IpAddr::V4(a), IpAddr::V4(b)) => self.v4.push((a.into(), b.into())),
            (IpAddr::V6(a), IpAddr::V6(b)) => self.v6.push((a.into(), b.into())),
            _ => {}
        }
    }

    fn build(self) -> IpSet {
        IpSet {
            v4: merge(self.v4),
            v6: merge(self.v6),
        }
    }
}

/// Sort ranges and join the overlapping or adjacent ones.
fn merge<T: Ord + Copy + num_like::Succ>(mut v: Vec<(T, T)>) -> Vec<(T, T)> {
    v.sort_unstable();
    let mut out: Vec<(T, T)> = Vec::with_capacity(v.len());
    for (lo, hi) in v {
        if let Some(last) = out.last_mut() {
            if lo <= last.1 || last.1.succ() == Some(lo) {
                last.1 = last.1.max(hi);
                continue;
            }
        }
        out.push((lo, hi));
    }
    out.shrink_to_fit();
    out
}

mod num_like {
    /// The next value, if any: lets `merge` join adjacent ranges.
    pub trait Succ: Sized {
        fn succ(self) -> Option<Self>;
    }
    impl Succ for u16 {
        fn succ(self) -> Option<u16> {
            self.checked_add(1)
        }
    }
    impl Succ for u32 {
        fn succ(self) -> Option<u32> {
            self.checked_add(1)
        }
    }
    impl Succ for u128 {
        fn succ(self) -> Option<u128> {
            self.checked_add(1)
        }
    }
}

/// One address token: `A`, `A-B` (same family, A ≤ B) or `A/len`, as the
/// first and last address it covers. Ok(None) if the token is not an
/// address at all (in the destination field it is then a host name); an
/// error if it starts as an address but is malformed.
pub fn parse_ip_range(tok: &str) -> Result<Option<(IpAddr, IpAddr)>, String> {
    let bad = |why: &str| Err(format!("'{}': {why}", quote(tok)));
    if let Some((a, len)) = tok.split_once('/') {
        let Some(ip) = crate::net::parse_ip(a) else {
            return Ok(None);
        };
        let bits = if ip.is_ipv4() { 32 } else { 128 };
        let len: u32 = match len.parse() {
            Ok(n) if n <= bits => n,
            _ => return bad(&format!("the prefix length must be 0 to {bits}")),
        };
        return Ok(Some(match ip {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
                let lo = u32::from(a) & mask;
                (IpAddr::V4(lo.into()), IpAddr::V4((lo | !mask).into()))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
                let lo = u128::from(a) & mask;
                (IpAddr::V6(lo.into()), IpAddr::V6((lo | !mask).into()))
            }
        }));
    }
    // IPv6 literals contain no '-', so the first '-' splits a range.
    if let Some((a, b)) = tok.split_once('-') {
        let Some(a) = crate::net::parse_ip(a) else {
            return Ok(None);
        };
        let Some(b) = crate::net::parse_ip(b) else {
            return bad("the end of the range is not an address");
        };
        let ordered = match (a, b) {
            (IpAddr::V4(x), IpAddr::V4(y)) => x <= y,
            (IpAddr::V6(x), IpAddr::V6(y)) => x <= y,
            _ => return bad("both ends of a range must be of one family"),
        };
        if !ordered {
            return bad("the range ends before it starts");
        }
        return Ok(Some((a, b)));
    }
    Ok(crate::net::parse_ip(tok).map(|a| (a, a)))
}

/// Destination host patterns: `name`, `*suffix`, `prefix*`, `*part*`,
/// compared without regard to case. Each kind is a hash set per pattern
/// length, so matching costs a few lookups whatever the number of patterns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameSet {
    exact: HashSet<String>,
    prefix: BTreeMap<usize, HashSet<String>>,
    suffix: BTreeMap<usize, HashSet<String>>,
    contains: BTreeMap<usize, HashSet<String>>,
}

impl NameSet {
    fn insert(&mut self, pat: &str) {
        let pat = pat.to_ascii_lowercase();
        let (head, p) = match pat.strip_prefix('*') {
            Some(p) => (true, p),
            None => (false, pat.as_str()),
        };
        let (tail, p) = match p.strip_suffix('*') {
            Some(p) => (true, p),
            None => (false, p),
        };
        let p = p.to_string();
        match (head, tail) {
            (false, false) => {
                self.exact.insert(p);
            }
            (false, true) => {
                self.prefix.entry(p.len()).or_default().insert(p);
            }
            (true, false) => {
                self.suffix.entry(p.len()).or_default().insert(p);
            }
            (true, true) => {
                self.contains.entry(p.len()).or_default().insert(p);
            }
        }
    }

    /// `host` must already be lowercase (see [`normalize_host`]).
    pub fn matches(&self, host: &str) -> bool {
        let b = host.as_bytes();
        let part = |from: usize, to: usize| std::str::from_utf8(&b[from..to]).ok();
        if self.exact.contains(host) {
            return true;
        }
        for (&n, set) in self.prefix.range(..=b.len()) {
            if part(0, n).is_some_and(|p| set.contains(p)) {
                return true;
            }
        }
        // `*suffix` wants the host strictly longer than the suffix.
        for (&n, set) in self.suffix.range(..b.len()) {
            if part(b.len() - n, b.len()).is_some_and(|p| set.contains(p)) {
                return true;
            }
        }
        for (&n, set) in self.contains.range(..=b.len()) {
            if (0..=b.len() - n).any(|i| part(i, i + n).is_some_and(|p| set.contains(p))) {
                return true;
            }
        }
        false
    }
}

/// A request's host as rules compare it: lowercase, no trailing dots.
pub fn normalize_host(h: &str) -> std::borrow::Cow<'_, str> {
    let t = h.trim_end_matches('.');
    // Most hosts are lowercase already: no copy for them (this runs for
    // every request).
    if t.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(t.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(t)
    }
}

/// Ports and port ranges, sorted and merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortSet(Vec<(u16, u16)>);

impl PortSet {
    pub fn parse(f: &str) -> Result<PortSet, String> {
        let mut v = Vec::new();
        for tok in f.split(',').filter(|s| !s.is_empty()) {
            let num = |s: &str| {
                s.parse::<u16>()
                    .map_err(|_| format!("'{}' is not a port or port range", quote(tok)))
            };
            let (a, b) = match tok.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(tok)?, num(tok)?),
            };
            if a > b {
                return Err(format!(
                    "'{}': the port range ends before it starts",
                    quote(tok)
                ));
            }
            v.push((a, b));
        }
        Ok(PortSet(merge(v)))
    }

    pub fn contains(&self, p: u16) -> bool {
        in_ranges(&self.0, p)
    }
}

/// Weekdays: digits 0-7 (0 and 7 are Sunday) and ranges `a-b`, separated
/// by commas. Returns a mask, bit n = weekday n.
fn parse_wdays(f: &str) -> Result<u8, String> {
    let mut mask = 0u8;
    for tok in f.split(',').filter(|s| !s.is_empty()) {
        let day = |s: &str| match s.parse::<u8>() {
            Ok(d) if d <= 7 && s.len() == 1 => Ok(d),
            _ => Err(format!(
                "'{}' is not a weekday (0-7) or range of weekdays",
                quote(tok)
            )),
        };
        let (a, b) = match tok.split_once('-') {
            Some((a, b)) => (day(a)?, day(b)?),
            None => (day(tok)?, day(tok)?),
        };
        if a > b {
            return Err(format!(
                "'{}': the weekday range ends before it starts",
                quote(tok)
            ));
        }
        for d in a..=b {
            mask |= 1 << (d % 7);
        }
    }
    Ok(mask)
}

/// Time periods `HH:MM:SS-HH:MM:SS`, comma separated, end exclusive, not
/// wrapping midnight.
fn parse_periods(f: &str) -> Result<Vec<(u32, u32)>, String> {
    let mut v = Vec::new();
    for tok in f.split(',').filter(|s| !s.is_empty()) {
        let bad = || format!("'{}' is not a time period HH:MM:SS-HH:MM:SS", quote(tok));
        let (a, b) = tok.split_once('-').ok_or_else(bad)?;
        let (a, b) = (parse_hms(a).ok_or_else(bad)?, parse_hms(b).ok_or_else(bad)?);
        if b < a {
            return Err(format!(
                "'{}': a period must not wrap midnight; split it in two",
                quote(tok)
            ));
        }
        v.push((a, b));
    }
    Ok(v)
}

fn parse_hms(s: &str) -> Option<u32> {
    let b = s.as_bytes();
    if b.len() != 8 || b[2] != b':' || b[5] != b':' {
        return None;
    }
    let two = |i: usize| -> Option<u32> {
        let (x, y) = (b[i], b[i + 1]);
        (x.is_ascii_digit() && y.is_ascii_digit())
            .then(|| u32::from(x - b'0') * 10 + u32::from(y - b'0'))
    };
    let (h, m, sec) = (two(0)?, two(3)?, two(6)?);
    // 24:00:00 is allowed as the end of a day.
    if h > 24 || m > 59 || sec > 59 || (h == 24 && (m, sec) != (0, 0)) {
        return None;
    }
    Some(h * 3600 + m * 60 + sec)
}

/// The operation a client asks for (the ACL's operation field).
#[allow(dead_code)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Connect,
    Bind,
    UdpAssoc,
    HttpGet,
    HttpPut,
    HttpPost,
    HttpHead,
    HttpConnect,
    HttpOther,
    FtpGet,
    FtpPut,
    FtpList,
    FtpData,
    Admin,
    DnsResolve,
}

impl Op {
    /// The operation's bit in an ACL operation mask.
    pub fn bits(self) -> u32 {
        match self {
            Op::Connect => OpBits::CONNECT,
            Op::Bind => OpBits::BIND,
            Op::UdpAssoc => OpBits::UDPASSOC,
            Op::HttpGet => OpBits::HTTP_GET,
            Op::HttpPut => OpBits::HTTP_PUT,
            Op::HttpPost => OpBits::HTTP_POST,
            Op::HttpHead => OpBits::HTTP_HEAD,
            Op::HttpConnect => OpBits::HTTP_CONNECT,
            Op::HttpOther => OpBits::HTTP_OTHER,
            Op::FtpGet => OpBits::FTP_GET,
            Op::FtpPut => OpBits::FTP_PUT,
            Op::FtpList => OpBits::FTP_LIST,
            Op::FtpData => OpBits::FTP_DATA,
            Op::Admin => OpBits::ADMIN,
            Op::DnsResolve => OpBits::DNSRESOLVE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(line: &str) -> Rule {
        Rule::parse(&fields(line)).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    fn fields(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    fn q() -> Query<'static> {
        Query {
            op: OpBits::CONNECT,
            ..Query::default()
        }
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    /// Data-driven: each case is (rule line, field to set, value, expected).
    fn check_src(rule_line: &str, cases: &[(&str, bool)]) {
        let r = rule(rule_line);
        for &(a, want) in cases {
            let got = r.matches(&Query { src: ip(a), ..q() });
            assert_eq!(got, want, "rule '{rule_line}', source {a}");
        }
    }

    fn check_dst(rule_line: &str, cases: &[(&str, bool)]) {
        let r = rule(rule_line);
        for &(a, want) in cases {
            let got = r.matches(&Query {
                dst: ip(a),
                port: 80,
                ..q()
            });
            assert_eq!(got, want, "rule '{rule_line}', destination {a}");
        }
    }

    fn check_host(rule_line: &str, cases: &[(&str, bool)]) {
        let r = rule(rule_line);
        for &(h, want) in cases {
            let h = normalize_host(h);
            let got = r.matches(&Query {
                host: Some(&h),
                port: 80,
                ..q()
            });
            assert_eq!(got, want, "rule '{rule_line}', host {h}");
        }
    }

    fn check_port(rule_line: &str, cases: &[(u16, bool)]) {
        let r = rule(rule_line);
        for &(p, want) in cases {
            let got = r.matches(&Query {
                dst: ip("10.0.0.1"),
                port: p,
                ..q()
            });
            assert_eq!(got, want, "rule '{rule_line}', port {p}");
        }
    }

    fn bad(line: &str, why: &str) {
        let e = Rule::parse(&fields(line)).unwrap_err();
        assert!(e.contains(why), "{line}: {e}");
    }

    #[test]
    fn star_and_empty_match_everything() {
        for line in ["", "*", "* * * * * * *"] {
            assert!(rule(line).matches(&q()));
            assert!(rule(line).matches(&Query {
                src: ip("::1"),
                user: Some("x"),
                ..q()
            }));
        }
    }

    #[test]
    fn ipv4_addresses_ranges_cidrs() {
        check_src(
            "* 10.0.0.1",
            &[("10.0.0.1", true), ("10.0.0.2", false), ("::1", false)],
        );
        check_src(
            "* 10.0.0.0/8",
            &[
                ("10.0.0.0", true),
                ("10.255.255.255", true),
                ("11.0.0.0", false),
                ("9.255.255.255", false),
            ],
        );
        check_src(
            "* 10.1.2.3/24",
            &[
                ("10.1.2.0", true),
                ("10.1.2.255", true),
                ("10.1.3.0", false),
            ],
        );
        check_src(
            "* 0.0.0.0/0",
            &[("1.2.3.4", true), ("255.255.255.255", true), ("::1", false)],
        );
        check_src("* 1.2.3.4/32", &[("1.2.3.4", true), ("1.2.3.5", false)]);
        check_src(
            "* 192.168.1.10-192.168.1.20,172.16.0.0/12",
            &[
                ("192.168.1.9", false),
                ("192.168.1.10", true),
                ("192.168.1.20", true),
                ("192.168.1.21", false),
                ("172.31.255.255", true),
                ("172.32.0.0", false),
            ],
        );
        // An IPv4-mapped IPv6 client is an IPv4 client.
        check_src(
            "* 127.0.0.0/8",
            &[("::ffff:127.0.0.1", true), ("::1", false)],
        );
    }

    #[test]
    fn ipv6_addresses_ranges_cidrs() {
        check_src(
            "* ::1",
            &[("::1", true), ("::2", false), ("0.0.0.1", false)],
        );
        check_src("* [::1]", &[("::1", true)]);
        check_src(
            "* 2001:db8::/32",
            &[
                ("2001:db8::", true),
                ("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", true),
                ("2001:db9::", false),
            ],
        );
        check_src(
            "* fe80::1-fe80::ff",
            &[("fe80::1", true), ("fe80::ff", true), ("fe80::100", false)],
        );
        check_src(
            "* ::/0",
            &[("::", true), ("ffff::", true), ("1.2.3.4", false)],
        );
        check_src(
            "* 2001:db8::1/128",
            &[("2001:db8::1", true), ("2001:db8::2", false)],
        );
    }

    #[test]
    fn bad_address_lists() {
        bad("* 10.0.0.0/33", "prefix length");
        bad("* ::/129", "prefix length");
        bad("* 10.0.0.0/x", "prefix length");
        bad("* 10.0.0.5-10.0.0.1", "ends before");
        bad("* 10.0.0.1-::1", "one family");
        bad("* 10.0.0.1-x", "end of the range");
        bad("* example.com", "not an IP");
        bad("* * 10.0.0.0/40", "prefix length");
    }

    #[test]
    fn overlapping_and_adjacent_ranges_merge() {
        let r = rule("* 10.0.0.0-10.0.0.10,10.0.0.5-10.0.0.20,10.0.0.21,10.0.1.0/24");
        assert_eq!(r.src.as_ref().unwrap().v4.len(), 2);
        check_src(
            "* 10.0.0.0-10.0.0.10,10.0.0.5-10.0.0.20,10.0.0.21,10.0.1.0/24",
            &[
                ("10.0.0.21", true),
                ("10.0.0.22", false),
                ("10.0.1.7", true),
            ],
        );
    }

    #[test]
    fn destination_addresses() {
        check_dst(
            "* * 10.0.0.0/24",
            &[("10.0.0.7", true), ("10.0.1.7", false), ("::1", false)],
        );
        // No destination address and no host: the field is not checked.
        assert!(rule("* * 10.0.0.0/24").matches(&q()));
    }

    #[test]
    fn host_wildcards() {
        check_host(
            "* * example.com",
            &[
                ("example.com", true),
                ("EXAMPLE.com.", true),
                ("www.example.com", false),
            ],
        );
        check_host(
            "* * *example.com",
            &[
                ("www.example.com", true),
                ("badexample.com", true),
                ("example.com", false),
                ("example.org", false),
            ],
        );
        check_host(
            "* * *.example.com",
            &[("a.example.com", true), ("example.com", false)],
        );
        check_host(
            "* * www.*",
            &[("www.x.org", true), ("www.a", true), ("ww.x.org", false)],
        );
        check_host(
            "* * *bad*",
            &[
                ("bad", true),
                ("a.bad.b", true),
                ("xbadx", true),
                ("bax", false),
            ],
        );
        check_host(
            "* * *Ads*,exact.org",
            &[
                ("myads.net", true),
                ("exact.org", true),
                ("exact.org.uk", false),
            ],
        );
        // A name-only entry is not checked for a request that gives only
        // an address (3proxy checks host names only when the request has one).
        assert!(rule("* * example.com").matches(&Query {
            dst: ip("1.2.3.4"),
            ..q()
        }));
        // An entry with both: an address or a name may match.
        let r = rule("* * 10.0.0.0/8,*.corp");
        let h = normalize_host("a.corp");
        assert!(r.matches(&Query {
            dst: ip("1.1.1.1"),
            host: Some(&h),
            ..q()
        }));
        assert!(r.matches(&Query {
            dst: ip("10.1.1.1"),
            host: Some("x.org"),
            ..q()
        }));
        assert!(!r.matches(&Query {
            dst: ip("1.1.1.1"),
            host: Some("x.org"),
            ..q()
        }));
    }

    #[test]
    fn names_that_look_like_ranges_are_names() {
        check_host("* * my-host.example", &[("my-host.example", true)]);
    }

    #[test]
    fn ports_and_ranges() {
        check_port("* * * 80", &[(80, true), (81, false), (79, false)]);
        check_port(
            "* * * 80,443,1000-2000",
            &[
                (443, true),
                (999, false),
                (1000, true),
                (2000, true),
                (2001, false),
            ],
        );
        check_port("* * * 0-65535", &[(1, true), (65535, true)]);
        check_port("* * * 1-1023,1024-2047", &[(2047, true), (2048, false)]);
        // A request without a port passes the field, except a BIND.
        assert!(rule("* * * 80").matches(&q()));
        assert!(!rule("* * * 80").matches(&Query {
            op: OpBits::BIND,
            ..q()
        }));
        bad("* * * 70000", "not a port");
        bad("* * * 90-80", "ends before");
        bad("* * * http", "not a port");
    }

    #[test]
    fn users() {
        let r = rule("alice,bob");
        assert!(r.matches(&Query {
            user: Some("alice"),
            ..q()
        }));
        assert!(!r.matches(&Query {
            user: Some("Alice"),
            ..q()
        }));
        assert!(!r.matches(&q()));
        assert!(rule("-").matches(&q()));
        assert!(!rule("-").matches(&Query {
            user: Some("alice"),
            ..q()
        }));
    }

    #[test]
    fn operations() {
        let at = |line: &str, op: u32| rule(line).matches(&Query { op, ..q() });
        assert!(at("* * * * CONNECT", OpBits::CONNECT));
        assert!(!at("* * * * CONNECT", OpBits::BIND));
        assert!(at("* * * * HTTP", OpBits::HTTP_GET));
        assert!(at("* * * * HTTP", OpBits::HTTP_OTHER));
        assert!(!at("* * * * HTTP", OpBits::HTTP_CONNECT));
        assert!(at("* * * * HTTPS", OpBits::HTTP_CONNECT));
        assert!(at("* * * * FTP", OpBits::FTP_DATA));
        assert!(at("* * * * HTTP_GET,HTTP_POST", OpBits::HTTP_POST));
        assert!(!at("* * * * HTTP_GET,HTTP_POST", OpBits::HTTP_PUT));
        assert!(at("* * * * ADMIN", OpBits::ADMIN));
        assert!(at("* * * * UDPASSOC,BIND", OpBits::UDPASSOC));
        bad("* * * * GET", "unknown operation");
    }

    #[test]
    fn weekdays() {
        let on = |line: &str, wday: u8| rule(line).matches(&Query { wday, ..q() });
        assert!(on("* * * * * 1-5", 1) && on("* * * * * 1-5", 5));
        assert!(!on("* * * * * 1-5", 6) && !on("* * * * * 1-5", 0));
        assert!(on("* * * * * 0", 0) && on("* * * * * 7", 0) && !on("* * * * * 7", 6));
        assert!(on("* * * * * 6-7", 0) && on("* * * * * 6-7", 6));
        assert!(on("* * * * * 1,3", 3) && !on("* * * * * 1,3", 2));
        bad("* * * * * 8", "weekday");
        bad("* * * * * 5-1", "ends before");
        bad("* * * * * mon", "weekday");
    }

    #[test]
    fn time_periods_at_boundaries() {
        let at = |line: &str, daysec: u32| rule(line).matches(&Query { daysec, ..q() });
        let l = "* * * * * * 09:00:00-17:30:00";
        assert!(!at(l, 9 * 3600 - 1));
        assert!(at(l, 9 * 3600));
        assert!(at(l, 17 * 3600 + 30 * 60 - 1));
        assert!(!at(l, 17 * 3600 + 30 * 60), "the end is exclusive");
        let two = "* * * * * * 00:00:00-01:00:00,23:00:00-24:00:00";
        assert!(at(two, 0) && at(two, 86399) && !at(two, 3600) && !at(two, 22 * 3600));
        bad("* * * * * * 23:00:00-01:00:00", "wrap midnight");
        bad("* * * * * * 9:00-17:00", "time period");
        bad("* * * * * * 25:00:00-26:00:00", "time period");
        bad("* * * * * * 10:60:00-11:00:00", "time period");
    }

    #[test]
    fn weight_field() {
        let r = rule("* * * * * * * 100");
        assert_eq!(r.weight, 100);
        assert!(r.matches(&Query { weight: 100, ..q() }));
        assert!(!r.matches(&Query { weight: 101, ..q() }));
        bad("* * * * * * * x", "weight");
        bad("* * * * * * * 1 extra", "unexpected");
    }

    #[test]
    fn first_match_wins_and_implicit_deny() {
        let e = |a: Action, line: &str| Entry {
            action: a,
            rule: rule(line),
            nolog: false,
            parents: Default::default(),
        };
        let acl = vec![
            e(Action::Deny, "* * * 25"),
            e(Action::Allow, "* 10.0.0.0/8"),
        ];
        let at = |src: &str, port| {
            check(
                &acl,
                &Query {
                    src: ip(src),
                    dst: ip("1.1.1.1"),
                    port,
                    ..q()
                },
            )
        };
        assert_eq!(at("10.1.1.1", 25), Verdict::Matched(0));
        assert_eq!(at("10.1.1.1", 80), Verdict::Matched(1));
        assert_eq!(at("11.1.1.1", 80), Verdict::NoMatch);
        assert_eq!(check(&[], &q()), Verdict::Empty);
    }

    #[test]
    fn big_lists_stay_correct() {
        // 10 000 disjoint /30 networks.
        let list: Vec<String> = (0..10_000u32)
            .map(|i| {
                let a = std::net::Ipv4Addr::from(0x0a00_0000 + i * 8);
                format!("{a}/30")
            })
            .collect();
        let r = Rule::parse(&["*".to_string(), list.join(",")]).unwrap();
        for i in [0u32, 1, 4999, 9999] {
            let base = 0x0a00_0000 + i * 8;
            let hit = IpAddr::V4((base + 3).into());
            let miss = IpAddr::V4((base + 4).into());
            assert!(r.matches(&Query {
                src: Some(hit),
                ..q()
            }));
            assert!(!r.matches(&Query {
                src: Some(miss),
                ..q()
            }));
        }
    }

    /// A small deterministic generator for the randomized checks.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn stab_finds_every_covering_interval() {
        let ranges = vec![
            (0u32, u32::MAX, 0),
            (10, 20, 1),
            (15, 15, 2),
            (15, 30, 3),
            (u32::MAX, u32::MAX, 4),
            (21, 21, 5),
        ];
        let s = Stab::build(ranges.clone());
        for x in [
            0u32,
            9,
            10,
            14,
            15,
            16,
            20,
            21,
            22,
            30,
            31,
            u32::MAX - 1,
            u32::MAX,
        ] {
            let mut got = Vec::new();
            s.stab(x, &mut got);
            got.sort_unstable();
            let want: Vec<u32> = ranges
                .iter()
                .filter(|&&(a, b, _)| a <= x && x <= b)
                .map(|&(_, _, id)| id)
                .collect();
            assert_eq!(got, want, "point {x}");
        }
        let empty: Stab<u128> = Stab::build(vec![]);
        let mut got = Vec::new();
        empty.stab(5, &mut got);
        assert!(got.is_empty());
    }

    #[test]
    fn index_agrees_with_the_walk_on_random_acls() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let users = ["alice", "bob", "carol", "-"];
        for round in 0..40 {
            let n = 1 + rng.below(60) as usize;
            let acl: Vec<Entry> = (0..n)
                .map(|_| {
                    let mut f = Vec::new();
                    f.push(match rng.below(3) {
                        0 => "*".to_string(),
                        _ => users[rng.below(4) as usize].to_string(),
                    });
                    f.push(match rng.below(4) {
                        0 => "*".to_string(),
                        1 => format!("10.0.{}.0/24", rng.below(4)),
                        2 => format!("10.0.0.{}-10.0.{}.9", rng.below(20), rng.below(3)),
                        _ => format!("10.0.0.0/{},::1", 16 + rng.below(16)),
                    });
                    f.push(
                        if rng.below(3) == 0 {
                            "*"
                        } else {
                            "192.0.2.0/28"
                        }
                        .to_string(),
                    );
                    f.push(match rng.below(3) {
                        0 => "*".to_string(),
                        _ => format!("{}", 80 + rng.below(3)),
                    });
                    let action = if rng.below(4) == 0 {
                        Action::Deny
                    } else {
                        Action::Allow
                    };
                    // A range that ends before it starts becomes `*`.
                    let rule = Rule::parse(&f).unwrap_or_else(|_| rule("*"));
                    Entry {
                        action,
                        rule,
                        nolog: false,
                        parents: Default::default(),
                    }
                })
                .collect();
            let index = Index::build_always(&acl);
            for _ in 0..300 {
                let src = match rng.below(5) {
                    0 => None,
                    1 => ip("::1"),
                    _ => Some(IpAddr::V4((0x0a00_0000 + rng.below(4 * 256) as u32).into())),
                };
                let user = match rng.below(5) {
                    0 => None,
                    i => Some(users[(i - 1) as usize]),
                };
                let query = Query {
                    user,
                    src,
                    dst: Some(IpAddr::V4((0xc000_0200 + rng.below(32) as u32).into())),
                    port: 79 + rng.below(4) as u16,
                    ..q()
                };
                assert_eq!(
                    check_indexed(&acl, &index, &query),
                    check(&acl, &query),
                    "round {round}, {query:?}"
                );
            }
        }
    }

    #[test]
    fn index_of_10000_cidr_lines_finds_the_last() {
        let mut acl: Vec<Entry> = (0..10_000u32)
            .map(|i| Entry {
                action: Action::Allow,
                rule: rule(&format!(
                    "* {}/30",
                    std::net::Ipv4Addr::from(0x0b00_0000 + i * 8)
                )),
                nolog: false,
                parents: Default::default(),
            })
            .collect();
        acl.push(Entry {
            action: Action::Allow,
            rule: rule("u1,u2 127.0.0.1"),
            nolog: false,
            parents: Default::default(),
        });
        acl.push(Entry {
            action: Action::Deny,
            rule: rule("u3"),
            nolog: false,
            parents: Default::default(),
        });
        let index = Index::build(&acl);
        assert!(index.enabled);
        let at = |src: &str, user: Option<&'static str>| {
            check_indexed(
                &acl,
                &index,
                &Query {
                    src: ip(src),
                    user,
                    ..q()
                },
            )
        };
        assert_eq!(at("127.0.0.1", Some("u2")), Verdict::Matched(10_000));
        assert_eq!(at("127.0.0.1", Some("u3")), Verdict::Matched(10_001));
        assert_eq!(at("127.0.0.2", Some("u1")), Verdict::NoMatch);
        assert_eq!(at("11.0.0.9", None), Verdict::Matched(1));
        assert_eq!(at("11.0.0.12", None), Verdict::NoMatch);
        // Small lists are walked.
        assert!(!Index::build(&acl[..3]).enabled);
    }
}
