//! Text made safe for where it goes: HTML, and the parts of a URL. One
//! copy for the admin service's pages and the ftp:// gateway's listings;
//! percent-encoding by the percent-encoding crate (rust-url's).

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// What a query value keeps as it is: RFC 3986's unreserved characters.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');
/// A path keeps its slashes too.
const PATH: &AsciiSet = &QUERY.remove(b'/');

/// `s` for HTML text or an attribute value: `&`, `<`, `>`, `"` and `'`
/// escaped, appended to `out`.
pub fn html_into(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
}

/// [`html_into`] a new string.
pub fn html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    html_into(s, &mut out);
    out
}

/// `s` as a query value: every byte but the unreserved ones %-encoded.
pub fn query(s: &str) -> String {
    utf8_percent_encode(s, QUERY).to_string()
}

/// `s` as a path, slashes kept, appended to `out`.
pub fn path_into(s: &str, out: &mut String) {
    out.extend(utf8_percent_encode(s, PATH));
}

/// `%XX` decoded (3proxy's decodeurl): a bad escape is kept as it is, and
/// bytes that are not UTF-8 are replaced.
pub fn decode(s: &str) -> String {
    percent_decode_str(s).decode_utf8_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_encodes() {
        assert_eq!(html("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
        assert_eq!(query("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        let mut p = String::new();
        path_into("/pub/a b/ü", &mut p);
        assert_eq!(p, "/pub/a%20b/%C3%BC");
        assert_eq!(decode("a%20b%2Fc%zz%4"), "a b/c%zz%4");
        assert_eq!(decode("%C3%A9%FF"), "é\u{FFFD}");
    }
}
