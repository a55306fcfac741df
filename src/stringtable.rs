//! StringsPlugin's strings file (3proxy's src/plugins/StringsPlugin,
//! 3proxy.cfg(5) PLUGINS): texts that replace the pages and answers the
//! HTTP proxy and the admin service send. Pure: the cfg handler reads the
//! file, [`parse`] takes its bytes.
//!
//! The file has a `[--proxy--]` section and an `[--admin--]` section,
//! each ended by `[/--proxy--]` or `[/--admin--]` (a marker counts
//! wherever it stands in a line). Inside, lines gather into one string
//! until a line holding `[end]`: each line loses its end (it is cut at its
//! first CR or LF), and a literal `\n` in it becomes CR LF. The N-th
//! string of a section replaces entry N of 3proxy's table for that
//! service (`proxy_stringtable[]` in proxy.c, `admin_stringtable[]` in
//! webadmin.c); an entry left empty, and an entry past the strings the
//! file has, keeps the text built in here.
//!
//! A replaced entry is sent byte for byte where 3proxy sends it: what the
//! indices below name. Lookups happen only where such a text goes out
//! (an error answer, a tunnel's first line, an admin page), never on a
//! request's way through.

use crate::res::Res;

/// Entries in 3proxy 1.0.0's proxy table.
pub const PROXY_COUNT: usize = 18;
/// Entries in 3proxy 1.0.0's admin table.
pub const ADMIN_COUNT: usize = 8;

/// Proxy table: 400, a request the proxy could not read.
pub const BAD_REQUEST: usize = 0;
/// Proxy table: 502, the host was not found or could not be reached.
pub const HOST_NOT_FOUND: usize = 1;
/// Proxy table: 503, a limit was used up (code 10).
pub const LIMITS: usize = 2;
/// Proxy table: 503, the request would loop through this proxy.
pub const RECURSION: usize = 3;
/// Proxy table: 501, not supported.
pub const NOT_IMPLEMENTED: usize = 4;
/// Proxy table: 502, a parent proxy failed.
pub const PARENT_FAILED: usize = 5;
/// Proxy table: 500, an internal error (codes 20-29).
pub const INTERNAL: usize = 6;
/// Proxy table: 407, credentials are asked for (Basic).
pub const AUTH_REQUIRED: usize = 7;
/// Proxy table: `200 Connection established`, a CONNECT's answer, also
/// the head of an ftp:// file.
pub const ESTABLISHED: usize = 8;
/// Proxy table: the head of an ftp:// directory listing 3proxy streams
/// (one longer than [`LONG_LISTING`]).
pub const LISTING_HEAD: usize = 9;
/// Proxy table: 404, the FTP server has no such file (code 780).
pub const NOT_FOUND: usize = 10;
/// Proxy table: 403, the ACL refused the request.
pub const FORBIDDEN: usize = 11;
/// Proxy table: 503, a filter refused the request (code 517).
pub const POLICY: usize = 15;
/// Proxy table: 401, the FTP server refused the login (700, 701).
pub const FTP_AUTH: usize = 16;

/// Where 3proxy stops building an FTP listing in memory and streams it,
/// headed by [`LISTING_HEAD`]: its 32 KiB line size.
pub const LONG_LISTING: usize = 32 * 1024;

/// Admin table: the 401 answer to a refused login, whole.
pub const ADMIN_AUTH: usize = 0;
/// Admin table: the start of every page, HTTP head included; a printf
/// format with three `%s`: the program's name twice, then its version.
pub const ADMIN_HEAD: usize = 1;
/// Admin table: `/S`'s start, HTTP head and XML prolog included.
pub const ADMIN_XML_HEAD: usize = 2;
/// Admin table: `/S`'s end.
pub const ADMIN_XML_TAIL: usize = 3;
/// Admin table: `/SX`, the style sheet, HTTP head included.
pub const ADMIN_STYLE: usize = 4;
/// Admin table: the end of every page.
pub const ADMIN_TAIL: usize = 5;

/// The replaced entries of both tables (None: the built-in text).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Strings {
    proxy: [Option<Box<[u8]>>; PROXY_COUNT],
    admin: [Option<Box<[u8]>>; ADMIN_COUNT],
}

impl Strings {
    /// Entry `i` of the proxy table, if the file replaced it.
    pub fn proxy(&self, i: usize) -> Option<&[u8]> {
        self.proxy.get(i)?.as_deref()
    }

    /// Entry `i` of the admin table, if the file replaced it.
    pub fn admin(&self, i: usize) -> Option<&[u8]> {
        self.admin.get(i)?.as_deref()
    }

    /// The page that replaces the HTTP proxy's answer to a request that
    /// failed with `res` ([`error_index`]), if the file has one.
    pub fn proxy_error(&self, res: Res, needuser: bool) -> Option<&[u8]> {
        self.proxy(error_index(res, needuser)?)
    }
}

/// The proxy table's entry 3proxy answers a failed request with, by its
/// result code (proxy.c, after its CLEANRET label), if any: `needuser`
/// is whether the service asks for credentials (it does unless `-u`),
/// so that codes 2-9 ask for them rather than refuse.
pub fn error_index(res: Res, needuser: bool) -> Option<usize> {
    // 3proxy answers no code out of these (0, 80-99, 101-510, ...).
    Some(match res.0 {
        10 => LIMITS,
        700 | 701 => FTP_AUTH,
        100 | 11..=19 | 702..=705 => HOST_NOT_FOUND,
        20..=29 => INTERNAL,
        30..=79 => PARENT_FAILED,
        1 => FORBIDDEN,
        2..=9 if !needuser => FORBIDDEN,
        2..=9 => AUTH_REQUIRED,
        999 => NOT_IMPLEMENTED,
        519 => RECURSION,
        517 => POLICY,
        780 => NOT_FOUND,
        511..=516 => BAD_REQUEST,
        _ => return None,
    })
}

/// A strings file read: the table, and what in it looked wrong (each a
/// phrase for the cfg's one warning; 3proxy goes on too).
#[derive(Debug)]
pub struct Parsed {
    pub strings: Strings,
    pub problems: Vec<String>,
}

/// Read a strings file's two sections.
pub fn parse(text: &[u8]) -> Parsed {
    let mut problems = Vec::new();
    let mut strings = Strings::default();
    section(text, "proxy", &mut strings.proxy, &mut problems);
    section(text, "admin", &mut strings.admin, &mut problems);
    Parsed { strings, problems }
}

/// The section `[--NAME--]` of `text` into `table` (3proxy looks for each
/// section from the file's start).
fn section(text: &[u8], name: &str, table: &mut [Option<Box<[u8]>>], problems: &mut Vec<String>) {
    let start = format!("[--{name}--]");
    let stop = format!("[/--{name}--]");
    // A C string ends at its first NUL: so does each line here.
    let mut lines = text
        .split_inclusive(|&b| b == b'\n')
        .map(|l| l.split(|&b| b == 0).next().unwrap_or_default());
    if !lines.by_ref().any(|l| contains(l, start.as_bytes())) {
        problems.push(format!(
            "there is no {start} section (the {name} texts stay built in)"
        ));
        return;
    }
    let mut n = 0;
    let mut text_open = false;
    let mut closed = false;
    let mut acc: Vec<u8> = Vec::new();
    for line in lines {
        if contains(line, stop.as_bytes()) {
            closed = true;
            break;
        }
        if contains(line, b"[end]") {
            if let Some(slot) = table.get_mut(n) {
                *slot = (!acc.is_empty()).then(|| std::mem::take(&mut acc).into());
            }
            acc.clear();
            text_open = false;
            n += 1;
            continue;
        }
        text_open = true;
        if n < table.len() {
            let cut = line
                .iter()
                .position(|&b| b == b'\r' || b == b'\n')
                .unwrap_or(line.len());
            unescape_into(&line[..cut], &mut acc);
        }
    }
    let have = table.len();
    if !closed {
        problems.push(format!("{start} does not end with {stop}"));
    }
    if n < have {
        problems.push(format!(
            "{start} has {} where 3proxy has {have} (entries {n}-{} stay built in)",
            strings(n),
            have - 1
        ));
    } else if n > have && closed {
        problems.push(format!(
            "{start} has {} where 3proxy has {have} (the last {} not used)",
            strings(n),
            match n - have {
                1 => "one is".to_string(),
                k => format!("{k} are"),
            }
        ));
    }
    if text_open {
        problems.push(format!("{start} has text after its last [end] (not used)"));
    }
}

fn strings(n: usize) -> String {
    match n {
        1 => "1 string".into(),
        n => format!("{n} strings"),
    }
}

/// `line` with each literal `\n` turned into CR LF, added to `out`.
fn unescape_into(line: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < line.len() {
        if line[i] == b'\\' && line.get(i + 1) == Some(&b'n') {
            out.extend_from_slice(b"\r\n");
            i += 2;
        } else {
            out.push(line[i]);
            i += 1;
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `fmt` as C's printf formats it when every conversion is `%s` (the
/// admin table's page start): `%s` takes the next of `args` (nothing once
/// they are used up), `%%` is `%`, any other `%` stays as it is.
pub fn printf_s(fmt: &[u8], args: &[&str]) -> Vec<u8> {
    let mut out = Vec::with_capacity(fmt.len() + 64);
    let mut args = args.iter();
    let mut i = 0;
    while i < fmt.len() {
        match (fmt[i], fmt.get(i + 1)) {
            (b'%', Some(b's')) => {
                out.extend_from_slice(args.next().map_or(&b""[..], |a| a.as_bytes()));
                i += 2;
            }
            (b'%', Some(b'%')) => {
                out.push(b'%');
                i += 2;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file with `proxy` and `admin` as the sections' bodies.
    fn file(proxy: &str, admin: &str) -> Vec<u8> {
        format!("[--proxy--]\n{proxy}[/--proxy--]\n[--admin--]\n{admin}[/--admin--]\n").into_bytes()
    }

    fn ends(n: usize) -> String {
        "[end]\n".repeat(n)
    }

    #[test]
    fn lines_gather_until_end_and_backslash_n_is_crlf() {
        let proxy = format!(
            "HTTP/1.0 403 Forbidden\\r\\n\nX: y\\n\\n\r\n<b>no</b>\n[end]\n{}",
            ends(PROXY_COUNT - 1)
        );
        let p = parse(&file(&proxy, &ends(ADMIN_COUNT)));
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        // `\r` is not an escape: only `\n` is.
        assert_eq!(
            p.strings.proxy(0).unwrap(),
            b"HTTP/1.0 403 Forbidden\\r\r\nX: y\r\n\r\n<b>no</b>"
        );
        for i in 1..PROXY_COUNT {
            assert_eq!(p.strings.proxy(i), None, "{i}");
        }
        assert!(p.strings.admin(0).is_none());
    }

    #[test]
    fn entries_by_position_and_markers_anywhere_in_a_line() {
        let mut proxy = ends(FORBIDDEN);
        proxy += "forbidden\\n\n x [end] y\nrequired\nsecond line\n[end]\n";
        proxy += &ends(PROXY_COUNT - FORBIDDEN - 2);
        let text = format!(
            "# comment\nsome text [--admin--] here\nA0\n[end]\nA1 %s\n[end]\n{}end [/--admin--]\n\
             [--proxy--]\n{proxy}[/--proxy--]\n",
            ends(ADMIN_COUNT - 2)
        );
        let p = parse(text.as_bytes());
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        assert_eq!(p.strings.proxy(FORBIDDEN).unwrap(), b"forbidden\r\n");
        assert_eq!(
            p.strings.proxy(FORBIDDEN + 1).unwrap(),
            b"requiredsecond line"
        );
        assert_eq!(p.strings.admin(0).unwrap(), b"A0");
        assert_eq!(p.strings.admin(1).unwrap(), b"A1 %s");
    }

    #[test]
    fn a_line_ends_at_its_first_cr_and_a_string_at_a_nul() {
        let proxy = format!("ab\rcd\nef\0gh\n[end]\n{}", ends(PROXY_COUNT - 1));
        let p = parse(&file(&proxy, &ends(ADMIN_COUNT)));
        assert_eq!(p.strings.proxy(0).unwrap(), b"abef");
    }

    #[test]
    fn what_looks_wrong_is_said_and_what_was_read_is_used() {
        // Fewer strings, a section missing.
        let p = parse(b"[--proxy--]\nfirst\n[end]\n[/--proxy--]\n");
        assert_eq!(p.strings.proxy(0).unwrap(), b"first");
        assert_eq!(
            p.problems,
            [
                "[--proxy--] has 1 string where 3proxy has 18 (entries 1-17 stay built in)",
                "there is no [--admin--] section (the admin texts stay built in)",
            ]
        );
        // More strings: the extra ones are not used.
        let p = parse(&file(
            &format!("{}extra\n[end]\n", ends(PROXY_COUNT)),
            &ends(ADMIN_COUNT),
        ));
        assert_eq!(
            p.problems,
            ["[--proxy--] has 19 strings where 3proxy has 18 (the last one is not used)"]
        );
        assert_eq!(p.strings, Strings::default());
        // No end marker, text no [end] closes.
        let p = parse(format!("[--admin--]\n{}x\ntail", ends(ADMIN_COUNT)).as_bytes());
        assert_eq!(
            p.problems,
            [
                "there is no [--proxy--] section (the proxy texts stay built in)",
                "[--admin--] does not end with [/--admin--]",
                "[--admin--] has text after its last [end] (not used)",
            ]
        );
        assert!(parse(b"").problems.len() == 2);
    }

    #[test]
    fn error_pages_by_result_code_as_3proxy_picks_them() {
        let cases = [
            (Res::OK, None),
            (Res::ACL_DENY, Some(FORBIDDEN)),
            (Res::AUTH_NO_USER, Some(AUTH_REQUIRED)),
            (Res::AUTH_BAD_USER, Some(AUTH_REQUIRED)),
            (Res::QUOTA, Some(LIMITS)),
            (Res::CONNECT, Some(HOST_NOT_FOUND)),
            (Res::NOHOST, Some(HOST_NOT_FOUND)),
            (Res::NOMEM, Some(INTERNAL)),
            (Res::RADIUS_REJECT, Some(INTERNAL)),
            (Res::PARENT_CONNECT_REFUSED, Some(PARENT_FAILED)),
            (Res::PARENT_SOCKS5_REP, Some(PARENT_FAILED)),
            (Res::ENDED, None),
            (Res::RECLAIMED, None),
            (Res::IDLE, None),
            (Res::SERVER_ERR, None),
            (Res::REDIRECTION_LOOP, None),
            (Res::HTTP_NO_REQUEST, None),
            (Res::BAD_REQUEST, Some(BAD_REQUEST)),
            (Res::HTTP_HEAD_TOO_LARGE, Some(BAD_REQUEST)),
            (Res::FILTER_DENY, Some(POLICY)),
            (Res::LOOP, Some(RECURSION)),
            (Res::HTTP_BAD_REPLY, None),
            (Res::FTP_LOGIN_REFUSED, Some(FTP_AUTH)),
            (Res::FTP_PASS_NO_REPLY, Some(FTP_AUTH)),
            (Res::FTP_BAD_GREETING, Some(HOST_NOT_FOUND)),
            (Res::FTP_PASS_SEND, Some(HOST_NOT_FOUND)),
            (Res::FTP_NO_GREETING, None),
            (Res::FTP_NO_DATA_CONN, Some(NOT_FOUND)),
            (Res::NOTIMPL, Some(NOT_IMPLEMENTED)),
            (Res::NOTIMPL_ATYP, None),
        ];
        for (res, want) in cases {
            assert_eq!(error_index(res, true), want, "{res:?}");
        }
        assert_eq!(error_index(Res::AUTH_BAD_USER, false), Some(FORBIDDEN));
        assert_eq!(error_index(Res::ACL_DENY, false), Some(FORBIDDEN));
    }

    #[test]
    fn printf_with_s_only() {
        assert_eq!(
            printf_s(b"<t>%s</t> 100%% %s %s %d %", &["a", "b"]),
            b"<t>a</t> 100% b  %d %"
        );
    }
}
