//! The cfg: a script of commands run in order (3proxy's `readconfig`).
//!
//! `load` reads a file line by line, skips comment lines, tokenizes the
//! rest (`token`), and runs each line through the command table
//! (`commands`). Commands change the [`State`]; a service command takes a
//! snapshot of that state and binds its listener at once, so a bind error
//! names its line. Nothing is served until the whole file has loaded:
//! `State::services` holds the prepared services, and the caller starts them.
//!
//! Invariants: the cfg is read on one thread; every error carries the file,
//! line and command that caused it.

pub mod access_cmds;
pub mod commands;
pub mod ops_cmds;
pub mod parent_cmds;
pub mod resolve_cmds;
pub mod token;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::log::Sink;
use crate::logformat::LogFormat;
use crate::services::Prepared;

/// The 11 `timeouts` values, in seconds, with 3proxy's slot names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts(pub [u32; 11]);

// All eleven slots are named; the services of later stages read the rest.
#[allow(dead_code)]
impl Timeouts {
    pub const BYTE_SHORT: usize = 0;
    pub const BYTE_LONG: usize = 1;
    pub const STRING_SHORT: usize = 2;
    pub const STRING_LONG: usize = 3;
    pub const CONNECTION_SHORT: usize = 4;
    pub const CONNECTION_LONG: usize = 5;
    pub const DNS: usize = 6;
    pub const CHAIN: usize = 7;
    pub const CONNECT: usize = 8;
    pub const CONNECTBACK: usize = 9;
    pub const LINGER: usize = 10;

    /// One slot as a Duration.
    pub fn get(&self, slot: usize) -> Duration {
        Duration::from_secs(u64::from(self.0[slot]))
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts([1, 5, 30, 60, 180, 1800, 15, 60, 15, 5, 5])
    }
}

/// A cfg error: where it happened and why. Printed as
/// `FILE:LINE: COMMAND: REASON`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CfgError {
    pub file: String,
    pub line: usize,
    pub command: String,
    pub reason: String,
}

impl std::fmt::Display for CfgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.command.is_empty() {
            write!(f, "{}:{}: {}", self.file, self.line, self.reason)
        } else {
            write!(
                f,
                "{}:{}: {}: {}",
                self.file, self.line, self.command, self.reason
            )
        }
    }
}

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
    depth: usize,
    /// Process and logging commands (`conf::ops_cmds`).
    pub ops: ops_cmds::Ops,
    /// `parentretries`: process-wide, installed by `finalize`.
    pub parent_retries: u32,
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
            ops: ops_cmds::Ops::default(),
            parent_retries: crate::parent::DEFAULT_RETRIES,
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

/// Deepest `include` nesting accepted; deeper is taken for a loop.
const MAX_INCLUDE_DEPTH: usize = 16;
/// 3proxy reads at most this many bytes from a `$FILE`.
const MAX_DOLLAR_FILE: u64 = 1 << 20;

/// Run the cfg text `text` (read from `file`) against `state`.
pub fn run_text(state: &mut State, file: &str, text: &str) -> Result<(), CfgError> {
    for (i, raw) in text.split('\n').enumerate() {
        let lineno = i + 1;
        // A line that is empty or starts with a blank or '#' is a comment:
        // 3proxy ignores every indented line, and so do we.
        match raw.as_bytes().first() {
            None | Some(b' ' | b'\t' | b'\r' | b'#') => continue,
            _ => {}
        }
        let err = |command: &str, reason: String| CfgError {
            file: file.to_string(),
            line: lineno,
            command: command.to_string(),
            reason,
        };
        let mut load = |path: &str| read_dollar_file(path);
        // A tokenizer error (bad quote, missing $FILE) still names the
        // command: the line's first word.
        let first = raw.split([' ', '\t', '\r']).next().unwrap_or("");
        let args = token::tokenize(raw, &mut load).map_err(|e| err(first, e))?;
        if args.is_empty() {
            continue;
        }
        // `end` stops reading this file (an included file's `end` ends
        // only that file).
        if args[0] == "end" && args.len() == 1 {
            break;
        }
        if args[0] == "include" {
            if args.len() != 2 {
                return Err(err("include", "wrong number of arguments: takes 1".into()));
            }
            include(state, &args[1]).map_err(|e| match e {
                Nested::Here(reason) => err("include", reason),
                Nested::Inner(inner) => inner,
            })?;
            continue;
        }
        commands::dispatch(state, &args).map_err(|reason| err(&args[0], reason))?;
    }
    Ok(())
}

enum Nested {
    Here(String),
    Inner(CfgError),
}

fn include(state: &mut State, path: &str) -> Result<(), Nested> {
    if state.depth >= MAX_INCLUDE_DEPTH {
        return Err(Nested::Here(format!(
            "{path}: includes nested more than {MAX_INCLUDE_DEPTH} deep"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| Nested::Here(format!("{path}: {e}")))?;
    state.depth += 1;
    let r = run_text(state, path, &text);
    state.depth -= 1;
    r.map_err(Nested::Inner)
}

fn read_dollar_file(path: &str) -> Result<String, String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| format!("${path}: {e}"))?;
    let mut s = String::new();
    f.take(MAX_DOLLAR_FILE)
        .read_to_string(&mut s)
        .map_err(|e| format!("${path}: {e}"))?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str) -> Result<State, CfgError> {
        let mut st = State::new(true);
        run_text(&mut st, "test.cfg", text).map(|_| st)
    }

    #[test]
    fn comments_and_indented_lines_are_skipped() {
        let st = run("# comment\n  maxconn 0\n\tbogus\n\r\nmaxconn 7\r\n").unwrap();
        assert_eq!(st.maxconn, 7);
    }

    #[test]
    fn end_stops_reading() {
        let st = run("maxconn 3\nend\nbogus command\n").unwrap();
        assert_eq!(st.maxconn, 3);
    }

    #[test]
    fn errors_name_file_line_and_command() {
        let e = run("maxconn 3\n\nmaxconn x\n").unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.line, e.command.as_str()),
            ("test.cfg", 3, "maxconn")
        );
        assert_eq!(e.to_string(), format!("test.cfg:3: maxconn: {}", e.reason));
    }

    #[test]
    fn unknown_and_arity_errors() {
        assert!(run("nosuchcommand\n")
            .unwrap_err()
            .reason
            .contains("unknown command"));
        assert!(run("maxconn\n")
            .unwrap_err()
            .reason
            .contains("wrong number of arguments"));
        assert!(run("maxconn 1 2\n")
            .unwrap_err()
            .reason
            .contains("wrong number of arguments"));
    }

    #[test]
    fn missing_include_is_an_error() {
        let e = run("include /nonexistent/x.cfg\n").unwrap_err();
        assert_eq!(e.command, "include");
        assert!(e.reason.contains("/nonexistent/x.cfg"));
    }

    #[test]
    fn unterminated_quote_names_the_line() {
        let e = run("maxconn 1\nlogformat \"abc\n").unwrap_err();
        assert_eq!(e.line, 2);
    }
}
