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
    /// The `ssl_*` settings so far.
    pub tls: crate::tls::Settings,
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
            tls: Default::default(),
        }
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
        for p in &mut self.services {
            let Some(svc) = Arc::get_mut(&mut p.svc) else {
                continue;
            };
            svc.timeouts = self.timeouts;
            svc.dialer.timeout = self.timeouts.get(Timeouts::CONNECT);
            svc.logdump = (self.ops.logdump.cli, self.ops.logdump.srv);
            svc.delimchar = self.ops.delimchar;
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
