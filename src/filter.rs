//! Regular-expression filters (3proxy.cfg(5) "PCRE FILTERING"; 3proxy's
//! pcre.c): `pcre`, `pcre_rewrite`, `pcre_extend` and `pcre_options` build
//! a chain that the HTTP proxy runs on a request line, the request and
//! response heads and the bodies.
//!
//! Patterns are compiled with the `regex` crate, not PCRE: its matching
//! takes time linear in the input, so a hostile page cannot make a filter
//! spin. What needs backtracking (back-references, look-around) is refused
//! when the cfg is read. Pure: no IO.

use std::sync::Arc;

use regex::bytes::{Regex, RegexBuilder};

use crate::acl::{Query, Rule};

/// The client's request line.
pub const REQUEST: u8 = 1;
/// The client's request head (as forwarded).
pub const CLIHEADER: u8 = 2;
/// The server's response head.
pub const SRVHEADER: u8 = 4;
/// The client's request body.
pub const CLIDATA: u8 = 8;
/// The server's response body.
pub const SRVDATA: u8 = 16;

const TYPES: &[(&str, u8)] = &[
    ("request", REQUEST),
    ("cliheader", CLIHEADER),
    ("srvheader", SRVHEADER),
    ("clidata", CLIDATA),
    ("srvdata", SRVDATA),
];

/// 3proxy's `filtermaxsize` default: 1 MiB.
pub const DEFAULT_MAXSIZE: usize = 1 << 20;

/// What a matching filter does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Pass the data without asking the filters after this one.
    Allow,
    /// Refuse the request (3proxy's `deny` and `remove`).
    Deny,
    /// Go on with the next filter (after a rewrite, say).
    Dunno,
}

/// The chain's answer for one piece of data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Deny,
}

/// One piece of a rewrite expression.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Lit(Vec<u8>),
    Group(usize),
}

/// One `pcre` or `pcre_rewrite` line (and its `pcre_extend` lines).
#[derive(Debug, Clone)]
pub struct Filter {
    kinds: u8,
    action: Action,
    /// None for the pattern `*`: the filter matches whatever its ACE does.
    re: Option<Regex>,
    replace: Option<Vec<Piece>>,
    /// The ACEs: the filter applies to a request any of them selects.
    aces: Vec<Rule>,
}

/// `pcre_options`: the flags later patterns are compiled with.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Options {
    caseless: bool,
    multiline: bool,
    dotall: bool,
    extended: bool,
    ungreedy: bool,
    unicode: bool,
    literal: bool,
    crlf: bool,
}

/// The filters a service has (a snapshot of the cfg at its line).
#[derive(Debug, Clone, Default)]
pub struct Filters {
    list: Vec<Arc<Filter>>,
    kinds: u8,
    /// Some ACE has weekdays or periods: the query needs the clock.
    timed: bool,
}

impl Options {
    /// Set the flag 3proxy's option `name` stands for. Options that only
    /// tune PCRE's optimizer, or say what the `regex` crate does anyway,
    /// are accepted and change nothing; one with no equivalent is an
    /// error naming it.
    pub fn set(&mut self, name: &str) -> Result<(), String> {
        let base = name
            .strip_prefix("PCRE2_")
            .or_else(|| name.strip_prefix("PCRE_"))
            .unwrap_or("");
        let pcre2 = name.starts_with("PCRE2_");
        match base {
            "CASELESS" => self.caseless = true,
            "MULTILINE" => self.multiline = true,
            "DOTALL" => self.dotall = true,
            "EXTENDED" => self.extended = true,
            "UNGREEDY" => self.ungreedy = true,
            "UTF" if pcre2 => self.unicode = true,
            "UTF8" if !pcre2 => self.unicode = true,
            "UCP" if pcre2 => self.unicode = true,
            "LITERAL" if pcre2 => self.literal = true,
            "NEWLINE_CRLF" | "NEWLINE_ANYCRLF" if !pcre2 => self.crlf = true,
            // `$` of `regex` matches only at the very end already; LF is
            // its line end; it never checks UTF-8 on bytes; the rest only
            // steer PCRE's optimizer or forbid what is off by default.
            "DOLLAR_ENDONLY" | "NO_AUTO_POSSESS" | "NO_DOTSTAR_ANCHOR" | "NO_START_OPTIMIZE"
            | "NEVER_UTF" | "NEVER_UCP" | "NEVER_BACKSLASH_C" | "MATCH_INVALID_UTF"
                if pcre2 => {}
            "DOLLAR_ENDONLY" | "NEWLINE_LF" | "NO_UTF8_CHECK" if !pcre2 => {}
            _ if KNOWN.contains(&name) => {
                return Err(format!(
                    "option '{name}' has no equivalent in this version's \
                     linear-time matcher"
                ))
            }
            _ => return Err(format!("unknown option '{name}'")),
        }
        Ok(())
    }
}

/// Every option name 3proxy 1.0 knows (pcre.c's table).
const KNOWN: &[&str] = &[
    "PCRE2_ALLOW_EMPTY_CLASS",
    "PCRE2_ALT_BSUX",
    "PCRE2_AUTO_CALLOUT",
    "PCRE2_DUPNAMES",
    "PCRE2_FIRSTLINE",
    "PCRE2_MATCH_UNSET_BACKREF",
    "PCRE2_NO_AUTO_CAPTURE",
    "PCRE2_ALT_CIRCUMFLEX",
    "PCRE2_ALT_VERBNAMES",
    "PCRE2_USE_OFFSET_LIMIT",
    "PCRE2_EXTENDED_MORE",
    "PCRE_ANCHORED",
    "PCRE_EXTRA",
    "PCRE_NOTBOL",
    "PCRE_NOTEOL",
    "PCRE_NOTEMPTY",
    "PCRE_NO_AUTO_CAPTURE",
    "PCRE_AUTO_CALLOUT",
    "PCRE_PARTIAL",
    "PCRE_DFA_SHORTEST",
    "PCRE_DFA_RESTART",
    "PCRE_FIRSTLINE",
    "PCRE_DUPNAMES",
    "PCRE_NEWLINE_CR",
    "PCRE_NEWLINE_ANY",
    "PCRE_BSR_ANYCRLF",
    "PCRE_BSR_UNICODE",
];

/// Compile `pattern` with `o`. A construct the linear-time matcher lacks
/// is named in the error.
fn compile(pattern: &str, o: &Options) -> Result<Regex, String> {
    let mut text = if o.literal {
        regex::escape(pattern)
    } else {
        pattern.to_string()
    };
    if !o.unicode {
        // Without a UTF option PCRE sees the pattern as bytes: `[é]` is
        // a class of two bytes. Write each non-ASCII character as the
        // escapes of its UTF-8 bytes, which bytes-mode `regex` reads so.
        let mut b = String::with_capacity(text.len());
        for ch in text.chars() {
            if ch.is_ascii() {
                b.push(ch);
            } else {
                let mut buf = [0u8; 4];
                for byte in ch.encode_utf8(&mut buf).bytes() {
                    b.push_str(&format!("\\x{byte:02X}"));
                }
            }
        }
        text = b;
    }
    RegexBuilder::new(&text)
        .case_insensitive(o.caseless)
        .multi_line(o.multiline)
        .dot_matches_new_line(o.dotall)
        .ignore_whitespace(o.extended)
        .swap_greed(o.ungreedy)
        .unicode(o.unicode)
        .crlf(o.crlf)
        .build()
        .map_err(|e| {
            let msg = e.to_string();
            let what = if msg.contains("backreference") {
                Some("a back-reference (\\1, \\k<name>)")
            } else if msg.contains("look-around") {
                Some("look-around ((?=, (?!, (?<=, (?<!)")
            } else {
                None
            };
            match what {
                Some(w) => format!(
                    "pattern '{pattern}' uses {w}, which the linear-time \
                     matcher of this version does not build"
                ),
                None => format!(
                    "bad pattern '{pattern}': {}",
                    msg.lines()
                        .last()
                        .unwrap_or("")
                        .trim_start_matches("error: ")
                ),
            }
        })
}

/// A rewrite expression as 3proxy reads it: `\r`, `\n` are line ends,
/// `\\` a backslash, `\0` ends the expression, a backslash before any
/// other character makes it literal (`\$1` is the text `$1`); `$N` is
/// group N of the match (`$0` the whole match), empty if the group did not
/// take part or does not exist.
fn parse_rewrite(s: &str) -> Vec<Piece> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut lit = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if i + 1 < b.len() => {
                match b[i + 1] {
                    b'r' => lit.push(b'\r'),
                    b'n' => lit.push(b'\n'),
                    b'0' => break,
                    c => lit.push(c),
                }
                i += 2;
            }
            b'$' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let mut j = i + 1;
                let mut n = 0usize;
                while j < b.len() && b[j].is_ascii_digit() {
                    n = n.saturating_mul(10).saturating_add((b[j] - b'0') as usize);
                    j += 1;
                }
                if !lit.is_empty() {
                    out.push(Piece::Lit(std::mem::take(&mut lit)));
                }
                out.push(Piece::Group(n));
                i = j;
            }
            c => {
                lit.push(c);
                i += 1;
            }
        }
    }
    if !lit.is_empty() {
        out.push(Piece::Lit(lit));
    }
    out
}

/// 3proxy reads the action by its first letters (`denylog` is `deny`).
fn parse_action(s: &str) -> Result<Action, String> {
    if s.starts_with("allow") {
        Ok(Action::Allow)
    } else if s.starts_with("deny") || s.starts_with("remove") {
        Ok(Action::Deny)
    } else if s.starts_with("dunno") {
        Ok(Action::Dunno)
    } else {
        Err(format!(
            "unknown filter action '{s}': allow, deny, remove or dunno"
        ))
    }
}

fn parse_types(s: &str) -> Result<u8, String> {
    // As in 3proxy, the word names every type it contains.
    let kinds = TYPES
        .iter()
        .filter(|(n, _)| s.contains(n))
        .fold(0, |k, (_, b)| k | b);
    if kinds == 0 {
        return Err(format!(
            "no filter type in '{s}': request, cliheader, srvheader, clidata, srvdata"
        ));
    }
    Ok(kinds)
}

impl Filter {
    /// `pcre TYPE ACTION REGEXP [ACE]` (`rewrite` None) or `pcre_rewrite
    /// TYPE ACTION REGEXP REWRITE [ACE]`.
    pub fn parse(
        kind: &str,
        action: &str,
        pattern: &str,
        rewrite: Option<&str>,
        ace: &[String],
        o: &Options,
    ) -> Result<Filter, String> {
        let kinds = parse_types(kind)?;
        let action = parse_action(action)?;
        let replace = rewrite.map(parse_rewrite);
        let rule = Rule::parse(ace)?;
        let re = if pattern.is_empty() || pattern == "*" {
            None
        } else {
            Some(compile(pattern, o)?)
        };
        Ok(Filter {
            kinds,
            action,
            re,
            replace,
            aces: vec![rule],
        })
    }

    fn applies(&self, q: &Query<'_>) -> bool {
        self.aces.iter().any(|r| r.matches(q))
    }

    /// Run on `buf`; only matches that start before `*cut` count. A
    /// rewrite moves `*cut` with the text it replaces, and past the end
    /// of a replacement that reaches over it. Some(action) if it decides.
    fn run(&self, buf: &mut Vec<u8>, cut: &mut usize) -> Option<Action> {
        let Some(re) = &self.re else {
            return Some(self.action);
        };
        let Some(replace) = &self.replace else {
            return re
                .find(buf)
                .filter(|m| m.start() < *cut)
                .map(|_| self.action);
        };
        let mut pos = 0;
        let mut n = 0;
        let mut rep = Vec::new();
        let mut locs = re.capture_locations();
        while pos <= buf.len() {
            let Some(m) = re.captures_read_at(&mut locs, buf, pos) else {
                break;
            };
            // At the very end of the data an empty match counts too.
            if m.start() > *cut || (m.start() == *cut && *cut < buf.len()) {
                break;
            }
            let (start, end) = (m.start(), m.end());
            rep.clear();
            for p in replace {
                match p {
                    Piece::Lit(l) => rep.extend_from_slice(l),
                    Piece::Group(g) => {
                        if let Some((a, b)) = locs.get(*g) {
                            rep.extend_from_slice(&buf[a..b]);
                        }
                    }
                }
            }
            buf.splice(start..end, rep.iter().copied());
            let new_end = start + rep.len();
            *cut = if end <= *cut {
                (*cut + rep.len() - (end - start)).max(new_end)
            } else {
                new_end
            };
            n += 1;
            // After an empty match, step over one byte of the input, or
            // the same empty match would be found again.
            pos = if start == end { new_end + 1 } else { new_end };
        }
        (n > 0).then_some(self.action)
    }
}

impl Filters {
    pub fn push(&mut self, f: Filter) {
        self.kinds |= f.kinds;
        self.timed |= f.aces.iter().any(Rule::timed);
        self.list.push(Arc::new(f));
    }

    /// `pcre_extend ACTION [ACE]`: one more ACE for the last filter.
    pub fn extend(&mut self, action: &str, ace: &[String]) -> Result<(), String> {
        parse_action(action)?;
        let rule = Rule::parse(ace)?;
        let Some(last) = self.list.last_mut() else {
            return Err("must follow a 'pcre' or 'pcre_rewrite' line".into());
        };
        self.timed |= rule.timed();
        // A service before this line keeps the filter as it was.
        Arc::make_mut(last).aces.push(rule);
        Ok(())
    }

    /// Some filter of type `kind` exists (the one test on a fast path).
    pub fn has(&self, kind: u8) -> bool {
        self.kinds & kind != 0
    }

    /// Some ACE has weekdays or periods.
    pub fn timed(&self) -> bool {
        self.timed
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Run the chain of type `kind` on the whole of `buf` (rewriting it).
    pub fn check(&self, kind: u8, q: &Query<'_>, buf: &mut Vec<u8>) -> Verdict {
        let mut cut = buf.len();
        self.check_window(kind, q, buf, &mut cut)
    }

    /// Run the chain on `buf`, counting only matches that start before
    /// `*cut` (see [`Filter::run`]).
    fn check_window(&self, kind: u8, q: &Query<'_>, buf: &mut Vec<u8>, cut: &mut usize) -> Verdict {
        for f in &self.list {
            if f.kinds & kind == 0 || !f.applies(q) {
                continue;
            }
            match f.run(buf, cut) {
                Some(Action::Allow) => return Verdict::Pass,
                Some(Action::Deny) => return Verdict::Deny,
                Some(Action::Dunno) | None => {}
            }
        }
        Verdict::Pass
    }
}

/// How long a held tail waits for more data when the sender pauses: then
/// it is filtered as it is and given out, so a request-and-answer protocol
/// never waits for bytes that will not come.
pub const FLUSH_AFTER: std::time::Duration = std::time::Duration::from_millis(300);

/// A body filtered as it streams: bytes are held until `max` of them are
/// there (or the body ends); then all but the last `max / 2` are filtered
/// and given out, so a match up to `max / 2` bytes long is found however
/// the data was split into reads, and no more than `max` bytes (plus one
/// read) are held.
pub struct Stream {
    kind: u8,
    max: usize,
    held: Vec<u8>,
}

impl Stream {
    pub fn new(kind: u8, max: usize) -> Stream {
        Stream {
            kind,
            max: max.max(2),
            held: Vec::new(),
        }
    }

    /// Bytes held, not yet given out.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Take `data` in (`end`: the body is complete); append what can be
    /// given out to `out`. Err on a deny.
    pub fn push(
        &mut self,
        f: &Filters,
        q: &Query<'_>,
        data: &[u8],
        end: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), ()> {
        self.held.extend_from_slice(data);
        if !end && self.held.len() < self.max {
            return Ok(());
        }
        let mut cut = if end {
            self.held.len()
        } else {
            self.held.len() - self.max / 2
        };
        if f.check_window(self.kind, q, &mut self.held, &mut cut) == Verdict::Deny {
            return Err(());
        }
        let cut = cut.min(self.held.len());
        out.extend_from_slice(&self.held[..cut]);
        self.held.drain(..cut);
        Ok(())
    }

    /// The sender paused ([`FLUSH_AFTER`]): filter and give out all held.
    pub fn flush(&mut self, f: &Filters, q: &Query<'_>, out: &mut Vec<u8>) -> Result<(), ()> {
        self.push(f, q, &[], true, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filters(lines: &[(&str, &str, &str, Option<&str>)], o: &Options) -> Filters {
        let mut fs = Filters::default();
        for (k, a, p, r) in lines {
            fs.push(Filter::parse(k, a, p, *r, &[], o).unwrap());
        }
        fs
    }

    fn run(fs: &Filters, kind: u8, s: &str) -> (Verdict, String) {
        let mut b = s.as_bytes().to_vec();
        let v = fs.check(kind, &Query::default(), &mut b);
        (v, String::from_utf8(b).unwrap())
    }

    #[test]
    fn allow_deny_dunno_in_order() {
        let o = Options::default();
        let fs = filters(
            &[
                ("srvdata", "dunno", "x", None),
                ("srvdata", "allow", "good", None),
                ("srvdata", "deny", "bad", None),
            ],
            &o,
        );
        assert_eq!(run(&fs, SRVDATA, "bad").0, Verdict::Deny);
        assert_eq!(run(&fs, SRVDATA, "good bad").0, Verdict::Pass);
        assert_eq!(run(&fs, SRVDATA, "x bad").0, Verdict::Deny);
        assert_eq!(run(&fs, CLIDATA, "bad").0, Verdict::Pass);
        let star = filters(&[("request,cliheader", "deny", "*", None)], &o);
        assert_eq!(run(&star, CLIHEADER, "").0, Verdict::Deny);
        assert!(star.has(REQUEST) && !star.has(SRVDATA));
    }

    #[test]
    fn rewrite_groups_and_escapes() {
        let o = Options::default();
        let fs = filters(
            &[("srvdata", "dunno", "(a+)(b)?", Some(r"[$2$1$7\$1\\\r\n]"))],
            &o,
        );
        assert_eq!(run(&fs, SRVDATA, "xaab-a").1, "x[baa$1\\\r\n]-[a$1\\\r\n]");
        let fs = filters(&[("srvdata", "dunno", "x*", Some("-"))], &o);
        assert_eq!(run(&fs, SRVDATA, "ab").1, "-a-b-");
        let fs = filters(&[("srvdata", "dunno", "o", Some(r"0\0tail"))], &o);
        assert_eq!(run(&fs, SRVDATA, "foo").1, "f00");
        // A rewrite with `deny` refuses once it replaced something.
        let fs = filters(&[("srvdata", "deny", "o", Some("0"))], &o);
        assert_eq!(run(&fs, SRVDATA, "foo").0, Verdict::Deny);
        assert_eq!(run(&fs, SRVDATA, "bar").0, Verdict::Pass);
    }

    #[test]
    fn options_map_to_flags() {
        let mut o = Options::default();
        o.set("PCRE_CASELESS").unwrap();
        let fs = filters(&[("srvdata", "deny", "secret", None)], &o);
        assert_eq!(run(&fs, SRVDATA, "SeCrEt").0, Verdict::Deny);
        let mut o = Options::default();
        o.set("PCRE2_DOTALL").unwrap();
        o.set("PCRE2_LITERAL").unwrap();
        let fs = filters(&[("srvdata", "deny", "a.b", None)], &o);
        assert_eq!(run(&fs, SRVDATA, "axb").0, Verdict::Pass);
        assert_eq!(run(&fs, SRVDATA, "a.b").0, Verdict::Deny);
        let e = Options::default().set("PCRE_NOTEMPTY").unwrap_err();
        assert!(e.contains("'PCRE_NOTEMPTY' has no equivalent"), "{e}");
        let e = Options::default().set("PCRE_BOGUS").unwrap_err();
        assert_eq!(e, "unknown option 'PCRE_BOGUS'");
    }

    #[test]
    fn non_ascii_literals_match_their_utf8_bytes() {
        let fs = filters(
            &[("srvdata", "deny", "слово|caf[eé]", None)],
            &Options::default(),
        );
        assert_eq!(run(&fs, SRVDATA, "одно слово").0, Verdict::Deny);
        assert_eq!(run(&fs, SRVDATA, "un café").0, Verdict::Deny);
        assert_eq!(run(&fs, SRVDATA, "cafx").0, Verdict::Pass);
    }

    #[test]
    fn refused_constructs_are_named() {
        let o = Options::default();
        let e = Filter::parse("srvdata", "deny", r"(a)\1", None, &[], &o).unwrap_err();
        assert!(e.contains("back-reference"), "{e}");
        let e = Filter::parse("srvdata", "deny", "a(?=b)", None, &[], &o).unwrap_err();
        assert!(e.contains("look-around"), "{e}");
        let e = Filter::parse("srvdata", "deny", "a(", None, &[], &o).unwrap_err();
        assert!(e.starts_with("bad pattern 'a('"), "{e}");
        assert!(Filter::parse("nothing", "deny", "a", None, &[], &o).is_err());
        assert!(Filter::parse("srvdata", "pass", "a", None, &[], &o).is_err());
    }

    #[test]
    fn stream_finds_a_match_split_across_reads() {
        let o = Options::default();
        let fs = filters(&[("srvdata", "dunno", "secret", Some("[gone]"))], &o);
        let q = Query::default();
        let mut s = Stream::new(SRVDATA, 16);
        let mut out = Vec::new();
        let body = "0123456789abcdefghij sec";
        s.push(&fs, &q, body.as_bytes(), false, &mut out).unwrap();
        assert!(s.held() <= 16 + 8);
        s.push(&fs, &q, b"ret and more text here, longer", false, &mut out)
            .unwrap();
        s.push(&fs, &q, b" secret", true, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "0123456789abcdefghij [gone] and more text here, longer [gone]"
        );
        let deny = filters(&[("srvdata", "deny", "secret", None)], &o);
        let mut s = Stream::new(SRVDATA, 8);
        let mut out = Vec::new();
        s.push(&deny, &q, b"se", false, &mut out).unwrap();
        assert!(s.push(&deny, &q, b"cret", true, &mut out).is_err());
    }
}
