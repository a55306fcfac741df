//! What the cfg script builds up as it runs (3proxy's `extparam` while
//! `readconfig` goes): the settings later service lines snapshot, the
//! services prepared so far, and the load's reading budget.

use std::net::IpAddr;
use std::sync::Arc;

use super::ops::Ops;
use crate::log::Sink;
use crate::logformat::LogFormat;
use crate::running::Prepared;
use crate::timeouts::Timeouts;

/// Most bytes one load reads: the cfg, its includes and its `$FILE`
/// insertions together. Reading stops there and the load fails.
pub const MAX_LOAD_BYTES: u64 = 16 << 20;

/// `minrate`'s default: 100 bytes a second after 3 s. Every honest head
/// or handshake measured takes well under the grace (bench/RESULTS.md,
/// "Under pressure"); a head of one byte every 5 s (slowloris) is closed
/// at 3-4 s instead of holding its slot to STRING_LONG.
pub const MINRATE: (u32, u32) = (100, 3);

/// `parklinger`'s default, in milliseconds: long enough that a session
/// with traffic every few tens of ms never parks, short enough that an
/// idle one gives its thread back soon.
pub const PARKLINGER: u32 = 250;
/// What the script has built so far: the settings later services snapshot,
/// and the services prepared (bound, not yet serving).
#[derive(Debug)]
pub struct State {
    pub timeouts: Timeouts,
    /// `internal`: default listen address of later services (raw text).
    pub internal: Option<String>,
    /// `external`: default source addresses, one IPv4 and one IPv6 slot.
    pub ext4: Option<IpAddr>,
    pub ext6: Option<IpAddr>,
    pub maxconn: u32,
    /// `reclaim`: a service at `maxconn` closes an idle or slow client
    /// for a new one (`live::pressure`); off queues as 3proxy does.
    pub reclaim: bool,
    /// `minrate RATE GRACE`: bytes a second a request head or handshake
    /// must keep after GRACE seconds (RATE 0: no least).
    pub minrate: (u32, u32),
    /// `backlog`; 0 means 1 + maxconn/8, as 3proxy computes it.
    pub backlog: u32,
    pub stacksize: i64,
    pub maxseg: u32,
    /// `parklinger`: milliseconds a relay stays quiet on its thread before
    /// it parks; 0 never parks.
    pub parklinger: u32,
    /// `log`: None means later services do not log.
    pub log: Option<Arc<Sink>>,
    pub logformat: Arc<LogFormat>,
    /// `-t`: check only. Services bind (to find taken ports) and close.
    pub check_only: bool,
    pub services: Vec<Prepared>,
    /// The resolver commands' settings (`nserver`, `nscache`, ...),
    /// installed process-wide by `finalize`.
    pub resolver: crate::resolve::Config,
    /// Keys of running sockets this cfg already reuses (one service each).
    pub claimed: Vec<String>,
    /// `auth`, the ACL, `users` and the limits (access control).
    pub access: crate::access::Setup,
    /// Nesting depth of `include`, to stop include loops.
    pub(super) depth: usize,
    /// Bytes this load may still read ([`MAX_LOAD_BYTES`] in all).
    pub(super) budget: u64,
    /// Process and logging commands (`conf::ops_cmds`).
    pub ops: Ops,
    /// `parentretries`: process-wide, installed by `finalize`.
    pub parent_retries: u32,
    /// `parenthealth`: for the parents that follow.
    pub parent_health: crate::health::Policy,
    /// `parentcheck`: for the parents that follow; None: no checks.
    pub parent_check: Option<crate::parentcheck::Check>,
    /// The parents `parentcheck` applies to, installed by `finalize`.
    pub probes: Vec<crate::parentcheck::Probe>,
    /// `happyeyeballs`: process-wide, set in every service by `finalize`.
    pub eyeballs: std::time::Duration,
    /// `--strict`: what 3proxy accepts leniently (and we warn about) is
    /// an error instead.
    pub strict: bool,
    /// The warnings of the load so far, each `FILE:LINE: COMMAND: why`.
    pub warnings: Vec<String>,
    /// Warnings of the line being run; `conf::run` adds file and line.
    pub(super) pending: Vec<String>,
    /// TransparentPlugin: None until its `plugin` line, then whether
    /// `transparent` (the default once loaded) or `notransparent` holds
    /// for the services that follow.
    pub transparent: Option<bool>,
    /// TrafficPlugin: None until its `plugin` line.
    pub traffic: Option<TrafficPlugin>,
    /// A `plugin` line loaded utf8tocp1251 (its auth type may be named).
    pub utf8tocp1251: bool,
    /// A `plugin` line loaded FilePlugin (its commands may be used).
    pub file_plugin: bool,
    /// The cfg loads utf8tocp1251 somewhere: its lines that are not UTF-8
    /// are read as Windows-1251 (`conf::run` looks before it runs).
    pub cp1251_text: bool,
    /// LdapPlugin: None until its `plugin` line, then what its commands
    /// have set (process-wide: the last line wins, wherever it stands).
    pub ldap: Option<LdapCmds>,
    /// StringsPlugin: the texts its file replaces; process-wide, set in
    /// every service by `finalize` (the last `plugin` line wins).
    pub strings: Option<Arc<crate::stringtable::Strings>>,
    /// `pcre`, `pcre_rewrite`: the filter chain later services take.
    pub filters: crate::filter::Filters,
    /// `pcre_options`: flags of later patterns.
    pub pcre_opts: crate::filter::Options,
    /// `filtermaxsize`: process-wide, installed by `finalize`.
    pub filtermaxsize: usize,
    /// The `ssl_*` settings so far.
    pub tls: crate::tls::Settings,
    /// `metricsusers`: process-wide, installed by `finalize`.
    pub metricsusers: usize,
    /// The last `radius` line: secret and servers; installed for every
    /// service by `finalize`, with the timeout.
    pub radius: Option<(Vec<u8>, Vec<crate::radius::Server>)>,
    /// `radiusinterim`: process-wide, installed with the `radius` line.
    pub radius_interim: Option<std::time::Duration>,
    /// `radiusdae`: the listener, bound; the caller installs it once the
    /// new cfg serves (`crate::dae::install`).
    pub dae: Option<crate::dae::Pending>,
}

/// What LdapPlugin's commands have set so far.
#[derive(Debug, Clone, Default)]
pub struct LdapCmds {
    /// `ldapconnect`: the servers as URIs, the DN and the password.
    pub connect: Option<(String, String, Option<String>)>,
    /// `ldapattr`: user attribute, group attribute, lowercase.
    pub attr: Option<(String, String, bool)>,
    pub userenv: Option<String>,
    pub sbase: Option<String>,
    pub access: Option<String>,
    /// `ldapdircount`: only `ldaptrafgroup`'s counter files use it.
    pub dircount: Option<String>,
    /// Some `auth` line names `ldap`.
    pub used: bool,
}

impl LdapCmds {
    /// The commands `auth ldap` needs and the cfg has not given.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if self.connect.is_none() {
            m.push("ldapconnect");
        }
        if self.attr.is_none() {
            m.push("ldapattr");
        }
        if self.userenv.is_none() {
            m.push("ldapuserenv");
        }
        if self.sbase.is_none() {
            m.push("ldapsbase");
        }
        if self.access.is_none() {
            m.push("ldapaccess");
        }
        m
    }

    /// The settings, when complete (the timeout is `finalize`'s).
    pub fn settings(&self) -> Option<crate::sys::ldap::Settings> {
        let (uris, bind_dn, bind_pw) = self.connect.clone()?;
        let (user_attr, group_attr, lowercase) = self.attr.clone()?;
        Some(crate::sys::ldap::Settings {
            uris,
            bind_dn,
            bind_pw,
            user_attr,
            group_attr,
            lowercase,
            userenv: self.userenv.clone()?,
            sbase: self.sbase.clone()?,
            access: self.access.clone()?,
            timeout: std::time::Duration::from_secs(5),
        })
    }
}

impl State {
    pub fn new(check_only: bool) -> State {
        State {
            timeouts: Timeouts::default(),
            internal: None,
            ext4: None,
            ext6: None,
            maxconn: 500,
            reclaim: true,
            minrate: MINRATE,
            backlog: 0,
            stacksize: 0,
            maxseg: 0,
            parklinger: PARKLINGER,
            log: None,
            logformat: Arc::new(LogFormat::parse(LogFormat::DEFAULT)),
            check_only,
            services: Vec::new(),
            resolver: crate::resolve::Config::default(),
            claimed: Vec::new(),
            access: crate::access::Setup::default(),
            ldap: None,
            depth: 0,
            budget: MAX_LOAD_BYTES,
            ops: Ops::default(),
            parent_retries: crate::parent::DEFAULT_RETRIES,
            parent_health: crate::health::Policy::default(),
            parent_check: None,
            probes: Vec::new(),
            eyeballs: crate::net::DEFAULT_EYEBALLS,
            strict: false,
            warnings: Vec::new(),
            pending: Vec::new(),
            transparent: None,
            traffic: None,
            utf8tocp1251: false,
            file_plugin: false,
            cp1251_text: false,
            strings: None,
            filters: Default::default(),
            pcre_opts: Default::default(),
            filtermaxsize: crate::filter::DEFAULT_MAXSIZE,
            tls: Default::default(),
            metricsusers: crate::metrics::DEFAULT_USER_CAP,
            radius: None,
            radius_interim: None,
            dae: None,
        }
    }

    /// Something 3proxy accepts without a word and we accept with one
    /// warning: `why` says what was wrong and the value 3proxy (and we)
    /// use instead. `conf::run` names the file, line and command; with
    /// `--strict` it is an error.
    pub fn lenient(&mut self, why: String) {
        self.pending.push(why);
    }

    /// The warnings not yet given a file and line (a command run outside
    /// `conf::run`: a standalone program's command line).
    pub fn take_pending(&mut self) -> Vec<String> {
        std::mem::take(&mut self.pending)
    }

    /// A number in `lo..=hi` that 3proxy reads with `atoi`: a word that
    /// is not a number is read as 3proxy reads it, with a warning
    /// (`value::atoi_number`).
    pub fn atoi<T>(&mut self, s: &str, lo: T, hi: T) -> Result<T, String>
    where
        T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy + TryFrom<i64>,
    {
        let (v, why) = super::value::atoi_number(s, lo, hi)?;
        if let Some(why) = why {
            self.lenient(why);
        }
        Ok(v)
    }
}

impl State {
    /// After the whole cfg has run: settings that 3proxy keeps process-wide
    /// (`timeouts`, the `log` target) take their final values in every
    /// service, wherever the command stood. A service logs only if some
    /// `log` came before it, as in 3proxy; `-l` keeps its own target.
    pub fn finalize(&mut self) {
        self.ops.finalize();
        crate::resolve::install(self.resolver.clone(), &self.timeouts);
        crate::charset::set_cp1251(self.utf8tocp1251);
        crate::parent::set_retries(self.parent_retries);
        crate::metrics::set_user_cap(self.metricsusers);
        if let Some((secret, servers)) = self.radius.take() {
            // Each server is waited for BYTE_LONG, as 3proxy waits.
            let mut c =
                crate::radius::Conf::new(secret, servers, self.timeouts.get(Timeouts::BYTE_LONG));
            c.interim = self.radius_interim;
            self.access.radius.set(c);
        }
        if let Some(s) = self.ldap.as_ref().and_then(|l| l.settings()) {
            // Each connect and each operation is waited for BYTE_LONG.
            self.access.ldap.set(crate::sys::ldap::Settings {
                timeout: self.timeouts.get(Timeouts::BYTE_LONG),
                ..s
            });
        }
        // `parentcheck` checks a parent from where the sessions of the
        // services that use it leave (`-e`, `-De`, `-ne`).
        self.probes = crate::parentcheck::for_services(
            std::mem::take(&mut self.probes),
            self.services
                .iter()
                .map(|p| (&p.svc.access.acl[..], &p.svc.dialer)),
        );
        // TrafficPlugin's rules, wherever they stand in the file, for the
        // services from its `plugin` line on: 3proxy's plugin wraps the
        // log function of the services that follow it, and looks at its
        // one list of rules at each record.
        let traffic = self
            .traffic
            .as_ref()
            .filter(|t| !t.rules.rules.is_empty() || t.rules.debug)
            .map(|t| (t.first_service, Arc::new(t.rules.clone())));
        for (i, p) in self.services.iter_mut().enumerate() {
            let Some(svc) = Arc::get_mut(&mut p.svc) else {
                continue;
            };
            if let Some((first, rules)) = &traffic {
                svc.traffic = (i >= *first).then(|| rules.clone());
            }
            svc.timeouts = self.timeouts;
            svc.dialer.timeout = self.timeouts.get(Timeouts::CONNECT);
            svc.dialer.eyeballs = self.eyeballs;
            svc.logdump = (self.ops.logdump.cli, self.ops.logdump.srv);
            svc.delimchar = self.ops.delimchar;
            svc.filtermaxsize = self.filtermaxsize;
            svc.strings.clone_from(&self.strings);
            if svc.opts.log.is_none() && svc.log.is_some() {
                svc.log = self.log.clone();
            }
        }
    }
}

/// What TrafficPlugin's `plugin` line and its `trafcorrect` lines set up.
#[derive(Debug)]
pub struct TrafficPlugin {
    /// The services from this one on (in `State::services`) came after
    /// the plugin's first `plugin` line: they take the rules.
    pub first_service: usize,
    /// The rules in their order (a later `plugin` line starts the list
    /// afresh, as 3proxy's plugin does), and `debug`.
    pub rules: crate::traffic::Rules,
}

/// Why reading a file for the cfg failed.
pub(super) enum ReadError {
    Io(std::io::Error),
    /// The load's byte budget ran out; what was read so far.
    TooBig(Vec<u8>),
}

pub(super) fn too_big() -> String {
    format!(
        "reading stopped at {} MiB, the most one load of the configuration \
         reads (the file, its includes and $FILE insertions together)",
        MAX_LOAD_BYTES >> 20
    )
}

impl State {
    /// Read `r` to its end (at most `most` bytes of it) against the load's
    /// byte budget; reading stops as soon as the budget is passed.
    pub(super) fn read_counted(
        &mut self,
        r: impl std::io::Read,
        most: u64,
    ) -> Result<Vec<u8>, ReadError> {
        use std::io::Read;
        let mut buf = Vec::new();
        let want = most.min(self.budget.saturating_add(1));
        r.take(want).read_to_end(&mut buf).map_err(ReadError::Io)?;
        let n = buf.len() as u64;
        if n > self.budget {
            return Err(ReadError::TooBig(buf));
        }
        self.budget -= n;
        Ok(buf)
    }
}
