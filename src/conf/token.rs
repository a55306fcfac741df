//! The cfg tokenizer: one line in, its arguments out (3proxy's `parsestr`).
//!
//! Rules, as 3proxy.cfg(5) defines them:
//! - arguments are separated by blanks (space, tab, CR, LF);
//! - `"` starts and ends a quoted part; inside quotes, `""` is a literal `"`
//!   and blanks and `$` are ordinary characters;
//! - outside quotes, `$FILE` (or `$"FILE"`) is replaced by the words of that
//!   file, whose line ends count as blanks; text glued in front of the `$`
//!   is glued to the file's first word; the file's own `$` are literal (no
//!   recursion).
//!
//! Whole-line rules (empty lines, lines starting with a blank or `#`) belong
//! to the reader in `conf::mod`, not here. Parsing does no IO: `$FILE` goes
//! through the `load` closure, so tests can feed files from memory.
//!
//! [`quote`] is how a message shows a piece of cfg input: escaped and cut,
//! so no message grows with its input or carries control bytes.

use std::fmt;

/// At most this many characters of one piece of cfg input are shown in a
/// message.
pub const QUOTE_MAX: usize = 80;

/// A piece of cfg input as messages show it (see [`quote`]).
pub struct Quoted<'a> {
    bytes: &'a [u8],
    max: usize,
}

/// Show `s` in a message: printable text as it is; tab, CR and LF as
/// `\t`, `\r`, `\n`; other control characters (and the Unicode line
/// separators and bidirectional overrides) as `\xNN` or `\u{NNNN}`; a byte
/// that is not UTF-8 as `\xNN`. After [`QUOTE_MAX`] characters the rest is
/// cut, and `...[cut, N bytes in all]` says so.
pub fn quote<S: AsRef<[u8]> + ?Sized>(s: &S) -> Quoted<'_> {
    quote_max(s, QUOTE_MAX)
}

/// [`quote`] with a limit of `max` characters.
pub fn quote_max<S: AsRef<[u8]> + ?Sized>(s: &S, max: usize) -> Quoted<'_> {
    Quoted {
        bytes: s.as_ref(),
        max,
    }
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        let mut shown = 0;
        let cut =
            |f: &mut fmt::Formatter<'_>| write!(f, "...[cut, {} bytes in all]", self.bytes.len());
        for chunk in self.bytes.utf8_chunks() {
            for c in chunk.valid().chars() {
                if shown == self.max {
                    return cut(f);
                }
                shown += 1;
                match c {
                    '\t' => f.write_str("\\t")?,
                    '\r' => f.write_str("\\r")?,
                    '\n' => f.write_str("\\n")?,
                    c if needs_escape(c) && (c as u32) < 0x80 => write!(f, "\\x{:02x}", c as u32)?,
                    c if needs_escape(c) => write!(f, "\\u{{{:x}}}", c as u32)?,
                    c => f.write_char(c)?,
                }
            }
            for b in chunk.invalid() {
                if shown == self.max {
                    return cut(f);
                }
                shown += 1;
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

/// Split one cfg line into arguments. `load` returns a file's contents for
/// `$FILE`, or a message saying why it could not be read.
pub fn tokenize(
    line: &str,
    load: &mut dyn FnMut(&str) -> Result<String, String>,
) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    split(line, true, load, &mut out)?;
    Ok(out)
}

fn split(
    line: &str,
    allow_include: bool,
    load: &mut dyn FnMut(&str) -> Result<String, String>,
    out: &mut Vec<String>,
) -> Result<(), String> {
    // `cur` is the word being built; it exists (Some) as soon as any
    // character or quote of it was seen, so `""` yields an empty argument.
    let mut cur: Option<String> = None;
    // Some(prefix) while reading the path of a `$FILE`: prefix is the text
    // glued before the `$`.
    let mut include: Option<(String, String)> = None;
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '"' {
            if quoted && chars.peek() == Some(&'"') {
                chars.next();
                push_char(&mut cur, &mut include, '"');
            } else {
                quoted = !quoted;
                if include.is_none() {
                    cur.get_or_insert_with(String::new);
                }
            }
            continue;
        }
        if !quoted && matches!(c, ' ' | '\t' | '\r' | '\n') {
            finish(&mut cur, &mut include, load, out)?;
            continue;
        }
        if c == '$' && !quoted && allow_include && include.is_none() {
            include = Some((cur.take().unwrap_or_default(), String::new()));
            continue;
        }
        push_char(&mut cur, &mut include, c);
    }
    if quoted {
        return Err("unterminated quote".into());
    }
    finish(&mut cur, &mut include, load, out)
}

fn push_char(cur: &mut Option<String>, include: &mut Option<(String, String)>, c: char) {
    match include {
        Some((_, path)) => path.push(c),
        None => cur.get_or_insert_with(String::new).push(c),
    }
}

fn finish(
    cur: &mut Option<String>,
    include: &mut Option<(String, String)>,
    load: &mut dyn FnMut(&str) -> Result<String, String>,
    out: &mut Vec<String>,
) -> Result<(), String> {
    if let Some((prefix, path)) = include.take() {
        if path.is_empty() {
            return Err("'$' without a file name".into());
        }
        let text = load(&path)?;
        let first = out.len();
        split(&text, false, load, out)?;
        if !prefix.is_empty() {
            if first < out.len() {
                out[first].insert_str(0, &prefix);
            } else {
                out.push(prefix);
            }
        }
    } else if let Some(word) = cur.take() {
        out.push(word);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn check(line: &str, expected: &[&str]) {
        let files: HashMap<&str, &str> = [
            ("users", "alice:CL:pw\nbob:CL:pw2\r\n"),
            ("ports", "  8080 \t 8081\n"),
            ("dollar", "$notanother \"q\"\n"),
            ("with space", "x y"),
            ("empty", ""),
        ]
        .into_iter()
        .collect();
        let mut load = |p: &str| {
            files
                .get(p)
                .map(|s| s.to_string())
                .ok_or_else(|| format!("{p}: cannot open"))
        };
        let got = tokenize(line, &mut load).unwrap();
        assert_eq!(got, expected, "line {line:?}");
    }

    fn check_err(line: &str, needle: &str) {
        let mut load = |p: &str| Err(format!("{p}: No such file or directory"));
        let err = tokenize(line, &mut load).unwrap_err();
        assert!(err.contains(needle), "{line:?}: {err}");
    }

    #[test]
    fn blanks_separate() {
        check("tcppm  -p1 \t host 80\r\n", &["tcppm", "-p1", "host", "80"]);
        check("", &[]);
        check("   ", &[]);
    }

    #[test]
    fn quotes() {
        check(r#"logformat "L%t %N""#, &["logformat", "L%t %N"]);
        check(r#"a "b ""c"" d" e"#, &["a", r#"b "c" d"#, "e"]);
        check(r#"a "" b"#, &["a", "", "b"]);
        check(r#"a"b c"d"#, &["ab cd"]);
        check(r#""$notafile""#, &["$notafile"]);
        check(r##""#x""##, &["#x"]);
    }

    #[test]
    fn unterminated_quote_is_an_error() {
        check_err(r#"a "b"#, "unterminated quote");
    }

    #[test]
    fn dollar_includes_words() {
        check("users $users", &["users", "alice:CL:pw", "bob:CL:pw2"]);
        check("tcppm $ports x", &["tcppm", "8080", "8081", "x"]);
        check(r#"a $"with space" b"#, &["a", "x", "y", "b"]);
        check("a $empty b", &["a", "b"]);
    }

    #[test]
    fn dollar_does_not_recurse() {
        check("a $dollar", &["a", "$notanother", "q"]);
    }

    #[test]
    fn text_before_dollar_glues_to_first_word() {
        check("a pre$ports", &["a", "pre8080", "8081"]);
        check("a pre$empty", &["a", "pre"]);
    }

    #[test]
    fn quote_escapes_control_and_non_utf8_bytes() {
        let q = |b: &[u8]| quote(b).to_string();
        assert_eq!(
            q(b"plain text: 'x' \\ \"y\" \xc3\xa9"),
            "plain text: 'x' \\ \"y\" \u{e9}"
        );
        assert_eq!(
            q(b"a\0b\tc\rd\ne\x1b[0m\x7f"),
            r"a\x00b\tc\rd\ne\x1b[0m\x7f"
        );
        assert_eq!(q(b"caf\xe9 \xff"), r"caf\xe9 \xff");
        assert_eq!(q("\u{85}\u{202e}".as_bytes()), r"\u{85}\u{202e}");
    }

    #[test]
    fn quote_cuts_long_input_and_says_so() {
        let exact = "x".repeat(QUOTE_MAX);
        assert_eq!(quote(&exact).to_string(), exact);
        let long = "\u{e9}".repeat(1_000_000);
        let shown = quote(&long).to_string();
        assert_eq!(
            shown,
            format!(
                "{}...[cut, 2000000 bytes in all]",
                "\u{e9}".repeat(QUOTE_MAX)
            )
        );
        let nuls = vec![0u8; 1 << 20];
        let shown = quote(&nuls).to_string();
        assert_eq!(
            shown,
            format!(
                "{}...[cut, 1048576 bytes in all]",
                r"\x00".repeat(QUOTE_MAX)
            )
        );
    }

    #[test]
    fn missing_file_is_an_error() {
        check_err("users $/nope", "/nope");
        check_err("users $", "without a file name");
    }
}
