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

impl State {
    pub fn new(check_only: bool) -> State {
        State {
            timeouts: Timeouts::default(),
            internal: None,
            ext4: None,
            ext6: None,
            maxconn: 500,
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
        crate::parent::set_retries(self.parent_retries);
        crate::metrics::set_user_cap(self.metricsusers);
        if let Some((secret, servers)) = self.radius.take() {
            // Each server is waited for BYTE_LONG, as 3proxy waits.
            let mut c =
                crate::radius::Conf::new(secret, servers, self.timeouts.get(Timeouts::BYTE_LONG));
            c.interim = self.radius_interim;
            self.access.radius.set(c);
        }
        // `parentcheck` checks a parent from where the sessions of the
        // services that use it leave (`-e`, `-De`, `-ne`).
        self.probes = crate::parentcheck::for_services(
            std::mem::take(&mut self.probes),
            self.services
                .iter()
                .map(|p| (&p.svc.access.acl[..], &p.svc.dialer)),
        );
        for p in &mut self.services {
            let Some(svc) = Arc::get_mut(&mut p.svc) else {
                continue;
            };
            svc.timeouts = self.timeouts;
            svc.dialer.timeout = self.timeouts.get(Timeouts::CONNECT);
            svc.dialer.eyeballs = self.eyeballs;
            svc.logdump = (self.ops.logdump.cli, self.ops.logdump.srv);
            svc.delimchar = self.ops.delimchar;
            svc.filtermaxsize = self.filtermaxsize;
            if svc.opts.log.is_none() && svc.log.is_some() {
                svc.log = self.log.clone();
            }
        }
    }
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
