//! The cfg: a script of commands run in order (3proxy's `readconfig`).
//!
//! `run` takes a file's bytes line by line, skips comment lines, decodes
//! and tokenizes the rest (`token`), and runs each line through the command table
//! (`commands`). Commands change the [`State`]; a service command takes a
//! snapshot of that state and binds its listener at once, so a bind error
//! names its line. Nothing is served until the whole file has loaded:
//! `State::services` holds the prepared services, and the caller starts them.
//!
//! Invariants: the cfg is read on one thread; every error carries the file,
//! line and command that caused it, escaped and cut (`CfgError::new`); one
//! load reads at most [`MAX_LOAD_BYTES`] (files, includes and `$FILE`s).

pub mod access_cmds;
pub mod commands;
pub mod filter_cmds;
pub mod ops;
pub mod ops_cmds;
pub mod parent_cmds;
pub mod plugin_cmds;
pub mod radius_cmds;
pub mod resolve_cmds;
pub mod state;
pub mod tls_cmds;
pub mod token;
pub mod value;

pub use state::State;
use state::{too_big, ReadError};

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

/// Deepest `include` nesting accepted; deeper is taken for a loop.
const MAX_INCLUDE_DEPTH: usize = 16;
/// The most a `$FILE` may hold; a longer one is an error (3proxy reads
/// its first 64 KiB and drops the rest without a word).
const MAX_DOLLAR_FILE: u64 = 1 << 20;
/// Longest command line, in bytes, its line end not counted (3proxy reads
/// 65534 bytes at a time). Comment lines may be longer.
pub const MAX_LINE: usize = 65535;
/// At most this many characters of a whole message's reason are shown; the
/// pieces of input in it are cut shorter still (`token::quote`).
const REASON_MAX: usize = 1000;

use token::quote;

impl CfgError {
    /// An error at `file:line` of `command`. Every field is shown escaped
    /// and the command and reason cut, whatever input they carry.
    pub fn new(file: &str, line: usize, command: &[u8], reason: &str) -> CfgError {
        CfgError {
            file: token::quote_max(file, 4096).to_string(),
            line,
            command: quote(command).to_string(),
            reason: token::quote_max(reason, REASON_MAX).to_string(),
        }
    }
}

/// Read the cfg itself (the file named on the command line, or standard
/// input) as bytes, within [`MAX_LOAD_BYTES`]. The error says
/// `NAME: why`, or `NAME:LINE: why` where the limit stopped the reading.
pub fn read_cfg(state: &mut State, name: &str, r: impl std::io::Read) -> Result<Vec<u8>, String> {
    match state.read_counted(r, u64::MAX) {
        Ok(b) => Ok(b),
        Err(ReadError::Io(e)) => Err(format!("{}: {e}", quote(name))),
        Err(ReadError::TooBig(b)) => {
            let line = b.iter().filter(|&&c| c == b'\n').count() + 1;
            Err(format!("{}:{line}: {}", quote(name), too_big()))
        }
    }
}

/// Where a load's `include` and `$FILE` files come from and what runs its
/// commands. [`run`] uses the disk and the command table; the cfg fuzz
/// target (`crate::fuzzing`) gives files from memory and runs only the
/// commands that touch nothing outside the [`State`].
pub trait Env {
    /// Open `path` for reading.
    fn open(&mut self, path: &str) -> std::io::Result<Box<dyn std::io::Read + '_>>;
    /// Run one command line (`args[0]` is the command).
    fn dispatch(&mut self, state: &mut State, args: &[String]) -> Result<(), String>;
}

/// The files on disk and the command table: what a real load uses.
struct Disk;

impl Env for Disk {
    fn open(&mut self, path: &str) -> std::io::Result<Box<dyn std::io::Read + '_>> {
        Ok(Box::new(std::fs::File::open(path)?))
    }

    fn dispatch(&mut self, state: &mut State, args: &[String]) -> Result<(), String> {
        commands::dispatch(state, args)
    }
}

/// Run the cfg `text` (read from `file`) against `state`. The text is
/// bytes: comment and indented lines are never decoded; every other line
/// must be UTF-8.
pub fn run(state: &mut State, file: &str, text: &[u8]) -> Result<(), CfgError> {
    state.cp1251_text |= loads_utf8tocp1251(text);
    run_in(state, file, text, &mut Disk)?;
    // LdapPlugin's commands may follow `auth ldap` (3proxy reads them at
    // each login); once the whole cfg has run they must all be there.
    if let Some(l) = state.ldap.as_ref().filter(|l| l.used) {
        let missing = l.missing();
        if !missing.is_empty() {
            return Err(CfgError {
                file: file.to_string(),
                line: text.split(|&b| b == b'\n').count() - usize::from(text.ends_with(b"\n")),
                command: "auth".into(),
                reason: format!(
                    "auth ldap needs LdapPlugin's {}, which the cfg does not give",
                    missing.join(", ")
                ),
            });
        }
    }
    Ok(())
}

/// Whether the cfg has a `plugin` line for utf8tocp1251: then its lines
/// that are not UTF-8 are Windows-1251 text, wherever they stand (3proxy
/// compares bytes, so a `users` line above the `plugin` line works there).
fn loads_utf8tocp1251(text: &[u8]) -> bool {
    text.split(|&b| b == b'\n')
        .any(|l| l.starts_with(b"plugin") && l.windows(12).any(|w| w == b"utf8tocp1251"))
}

/// [`run`], with files and commands from `env`.
pub fn run_in(
    state: &mut State,
    file: &str,
    text: &[u8],
    env: &mut dyn Env,
) -> Result<(), CfgError> {
    for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
        let lineno = i + 1;
        // A line that is empty or starts with white space (C's isspace:
        // blank, tab, CR, vertical tab, form feed) or '#' is a comment:
        // 3proxy ignores every indented line, and so do we.
        match raw.first() {
            None | Some(b' ' | b'\t' | b'\r' | b'\x0b' | b'\x0c' | b'#') => continue,
            _ => {}
        }
        let err = |command: &[u8], reason: &str| CfgError::new(file, lineno, command, reason);
        // An error before the line is split (too long, not UTF-8, a bad
        // quote, a missing $FILE) still names the command: the first word.
        let first = raw
            .split(|b| matches!(b, b' ' | b'\t' | b'\r'))
            .next()
            .unwrap_or_default();
        if raw.len() > MAX_LINE {
            return Err(err(
                first,
                &format!("the line is longer than {MAX_LINE} bytes"),
            ));
        }
        let line = match std::str::from_utf8(raw) {
            Ok(l) => std::borrow::Cow::Borrowed(l),
            Err(_) if state.cp1251_text => crate::charset::cp1251(raw),
            Err(e) => return Err(err(first, &not_utf8(raw, e.valid_up_to(), ""))),
        };
        let mut load = |path: &str| read_dollar_file(state, env, path);
        let args = token::tokenize(&line, &mut load).map_err(|e| err(first, &e))?;
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
                return Err(err(b"include", "wrong number of arguments: takes 1"));
            }
            include(state, env, &args[1]).map_err(|e| match e {
                Nested::Here(reason) => err(b"include", &reason),
                Nested::Inner(inner) => inner,
            })?;
            continue;
        }
        let r = env.dispatch(state, &args);
        let warned = std::mem::take(&mut state.pending);
        r.map_err(|reason| err(args[0].as_bytes(), &reason))?;
        for why in warned {
            if state.strict {
                return Err(err(args[0].as_bytes(), &format!("{why} {STRICT}")));
            }
            state
                .warnings
                .push(err(args[0].as_bytes(), &why).to_string());
        }
    }
    Ok(())
}

/// Appended to a leniency warning that `--strict` made an error.
pub const STRICT: &str = "(an error with --strict)";

/// The message for a byte that is not UTF-8 at `at` in `text`: a cfg line,
/// or the `$FILE` that `what` names.
fn not_utf8(text: &[u8], at: usize, what: &str) -> String {
    // Bytes before `at` are valid UTF-8.
    let before = std::str::from_utf8(&text[..at]).unwrap_or_default();
    let (line, col) = match before.rfind('\n') {
        Some(nl) => (before[..nl].matches('\n').count() + 2, &before[nl + 1..]),
        None => (1, before),
    };
    let col = col.chars().count() + 1;
    let place = if what.is_empty() {
        format!("column {col}")
    } else {
        format!("line {line}, column {col} of {what}")
    };
    format!(
        "byte 0x{:02x} at {place} is not UTF-8 (outside comments, the configuration must be UTF-8 text)",
        text[at]
    )
}

enum Nested {
    Here(String),
    Inner(CfgError),
}

fn include(state: &mut State, env: &mut dyn Env, path: &str) -> Result<(), Nested> {
    let shown = quote(path);
    if state.depth >= MAX_INCLUDE_DEPTH {
        return Err(Nested::Here(format!(
            "{shown}: includes nested more than {MAX_INCLUDE_DEPTH} deep"
        )));
    }
    let text = env
        .open(path)
        .map_err(ReadError::Io)
        .and_then(|f| state.read_counted(f, u64::MAX))
        .map_err(|e| match e {
            ReadError::Io(e) => Nested::Here(format!("{shown}: {e}")),
            ReadError::TooBig(_) => Nested::Here(format!("{shown}: {}", too_big())),
        })?;
    state.depth += 1;
    let r = run_in(state, path, &text, env);
    state.depth -= 1;
    r.map_err(Nested::Inner)
}

/// The text of a `$FILE`: at most [`MAX_DOLLAR_FILE`] bytes of it, within
/// the load's budget, all of it UTF-8.
fn read_dollar_file(state: &mut State, env: &mut dyn Env, path: &str) -> Result<String, String> {
    let what = format!("${}", quote(path));
    let buf = env
        .open(path)
        .map_err(ReadError::Io)
        .and_then(|f| state.read_counted(f, MAX_DOLLAR_FILE + 1))
        .map_err(|e| match e {
            ReadError::Io(e) => format!("{what}: {e}"),
            ReadError::TooBig(_) => format!("{what}: {}", too_big()),
        })?;
    if buf.len() as u64 > MAX_DOLLAR_FILE {
        // 3proxy reads the first 64 KiB and drops the rest without a word;
        // a list cut short is worse than a cfg that does not load.
        return Err(format!(
            "{what}: the file is larger than {} MiB, the most a $FILE may hold",
            MAX_DOLLAR_FILE >> 20
        ));
    }
    String::from_utf8(buf).or_else(|e| {
        if state.cp1251_text {
            return Ok(crate::charset::cp1251(e.as_bytes()).into_owned());
        }
        let at = e.utf8_error().valid_up_to();
        Err(not_utf8(e.as_bytes(), at, &what))
    })
}

#[cfg(test)]
mod tests {
    use super::state::MAX_LOAD_BYTES;
    use super::*;

    fn run(text: &str) -> Result<State, CfgError> {
        let mut st = State::new(true);
        super::run(&mut st, "test.cfg", text.as_bytes()).map(|_| st)
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

    fn run_bytes(text: &[u8]) -> Result<State, CfgError> {
        let mut st = State::new(true);
        super::run(&mut st, "test.cfg", text).map(|_| st)
    }

    #[test]
    fn comments_and_indented_lines_are_never_decoded() {
        let st = run_bytes(b"# caf\xe9\n \xff\xfe x\n\t\xe9\nmaxconn 7\nend\n\xe9\xe9\n").unwrap();
        assert_eq!(st.maxconn, 7);
    }

    #[test]
    fn a_byte_that_is_not_utf8_names_line_column_and_command() {
        let e = run_bytes(b"maxconn 7\nlogformat \"caf\xe9\"\n").unwrap_err();
        assert_eq!((e.line, e.command.as_str()), (2, "logformat"));
        assert!(
            e.reason.starts_with("byte 0xe9 at column 15 is not UTF-8"),
            "{}",
            e.reason
        );
        // Columns count characters: the \u{e9} before counts once.
        let mut line = "users \u{e9}:CL:p".as_bytes().to_vec();
        line.push(0xe9);
        let e = run_bytes(&line).unwrap_err();
        assert!(
            e.reason.starts_with("byte 0xe9 at column 13 "),
            "{}",
            e.reason
        );
        // In the command name itself: shown escaped.
        let e = run_bytes(b"max\xe9conn 7\n").unwrap_err();
        assert_eq!(e.command, r"max\xe9conn");
        assert!(e.reason.contains("column 4"), "{}", e.reason);
    }

    #[test]
    fn a_dollar_file_that_is_not_utf8_names_its_line_and_column() {
        let dir = std::env::temp_dir().join(format!("threeproxy-conf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("users.txt");
        std::fs::write(&f, b"alice:CL:pw\nbob:CL:p\xe9\n").unwrap();
        let e = run(&format!("\nusers ${}\n", f.display())).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!((e.line, e.command.as_str()), (2, "users"));
        assert!(
            e.reason.starts_with(&format!(
                "byte 0xe9 at line 2, column 9 of ${} is not UTF-8",
                f.display()
            )),
            "{}",
            e.reason
        );
    }

    #[test]
    fn a_command_line_longer_than_the_limit_is_an_error() {
        let ok = format!("logformat {}\n", "x".repeat(MAX_LINE - 10));
        assert!(run(&ok).is_ok());
        let long = format!("logformat {}\n", "x".repeat(MAX_LINE));
        let e = run(&long).unwrap_err();
        assert_eq!((e.line, e.command.as_str()), (1, "logformat"));
        assert!(e.reason.contains("longer than 65535 bytes"), "{}", e.reason);
        // A comment may be longer.
        let comment = format!("#{}\nmaxconn 3\n", "x".repeat(MAX_LINE * 2));
        assert_eq!(run(&comment).unwrap().maxconn, 3);
    }

    #[test]
    fn messages_escape_and_cut_the_input_they_quote() {
        let nuls = "\0".repeat(60_000);
        let e = run(&format!("maxconn {nuls}\n")).unwrap_err();
        let shown = format!(
            "'{}...[cut, 60000 bytes in all]' is not a number from 1 to 1000000",
            r"\x00".repeat(token::QUOTE_MAX)
        );
        assert_eq!(e.reason, shown);
        // A command name of NULs: escaped and cut too.
        let e = run(&format!("{nuls} 1\n")).unwrap_err();
        assert!(e.command.starts_with(r"\x00\x00"), "{}", e.command);
        assert!(e.command.len() < 400, "{}", e.command.len());
        assert!(!e.to_string().contains('\0'));
        // Whatever a reason holds, it is escaped and bounded.
        let e = CfgError::new("f\rg", 1, b"c\x1b", &"\x07".repeat(5000));
        assert_eq!(e.file, r"f\rg");
        assert_eq!(e.command, r"c\x1b");
        assert!(e.reason.len() < REASON_MAX * 4 + 40 && !e.reason.contains('\x07'));
    }

    /// A reader of endless bytes that counts what was taken from it.
    struct Endless<'a>(&'a std::cell::Cell<u64>, u8);

    impl std::io::Read for Endless<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            buf.fill(self.1);
            self.0.set(self.0.get() + buf.len() as u64);
            Ok(buf.len())
        }
    }

    #[test]
    fn reading_the_cfg_stops_at_the_limit() {
        let taken = std::cell::Cell::new(0);
        let mut st = State::new(true);
        let e = read_cfg(&mut st, "big.cfg", Endless(&taken, b'\n')).unwrap_err();
        let line = MAX_LOAD_BYTES + 2;
        assert_eq!(e, format!("big.cfg:{line}: {}", too_big()));
        assert!(taken.get() <= MAX_LOAD_BYTES + (1 << 16), "{}", taken.get());
        // Within the limit: the bytes as they are, and the budget spent.
        let mut st = State::new(true);
        let text = read_cfg(&mut st, "x", &b"maxconn 3\n"[..]).unwrap();
        assert_eq!(text, b"maxconn 3\n");
        assert_eq!(st.budget, MAX_LOAD_BYTES - 10);
    }

    #[test]
    fn includes_and_dollar_files_share_the_limit() {
        let e = run("maxconn 2\ninclude /dev/zero\n").unwrap_err();
        assert_eq!((e.line, e.command.as_str()), (2, "include"));
        assert_eq!(e.reason, format!("/dev/zero: {}", too_big()));
        // 1 MiB per $FILE (the most one holds): the 17th insertion
        // passes 16 MiB.
        let mib = std::env::temp_dir().join(format!("threeproxy-mib-{}", std::process::id()));
        std::fs::write(&mib, vec![b'a'; 1 << 20]).unwrap();
        let m = mib.display();
        let e = run(&format!("logformat ${m}\n").repeat(20)).unwrap_err();
        assert_eq!((e.line, e.command.as_str()), (17, "logformat"));
        assert_eq!(e.reason, format!("${m}: {}", too_big()));
        // A budget already spent by the file itself counts too.
        let mut st = State::new(true);
        st.budget = 10;
        let e = run_on(&mut st, &format!("users ${m}\n")).unwrap_err();
        assert_eq!(e.reason, format!("${m}: {}", too_big()));
        let _ = std::fs::remove_file(&mib);
        // An endless file is larger than 1 MiB: refused at once.
        let e = run("users $/dev/zero\n").unwrap_err();
        assert_eq!(
            e.reason,
            "$/dev/zero: the file is larger than 1 MiB, the most a $FILE may hold"
        );
    }

    fn run_on(st: &mut State, text: &str) -> Result<(), CfgError> {
        super::run(st, "test.cfg", text.as_bytes())
    }
}
