//! The cipher commands (`ssl_*_ciphersuites` for TLS 1.3, `ssl_*_cipher_list`
//! for TLS 1.2) in OpenSSL's language, mapped onto the suites rustls's
//! ring provider has. Pure: words in, suites or a message out.
//!
//! TLS 1.3 (`ciphersuites`): a `:`-separated list of IANA names, in order
//! of preference (OpenSSL's `SSL_CTX_set_ciphersuites`).
//!
//! TLS 1.2 (`cipher_list`): OpenSSL's cipher string, words separated by
//! `:`, `,` or spaces; a word is a suite name (OpenSSL's, like
//! `ECDHE-RSA-AES128-GCM-SHA256`, or IANA's) or a keyword (`HIGH`,
//! `ECDHE`, `AESGCM`, `aRSA`, ...), several joined by `+` meaning all of
//! them; prefixed `!` removes for good, `-` removes, `+` moves to the end;
//! `@STRENGTH` and `@SECLEVEL=N` are accepted and change nothing. Keywords
//! that name only what rustls never offers (`aNULL`, `MD5`, `RC4`, `DHE`,
//! `kRSA`, `MEDIUM`, ...) select nothing, so `HIGH:!aNULL:!MD5` means
//! every suite here. A suite name rustls does not offer, or a word that is
//! neither, is an error naming it.

use rustls::crypto::ring::cipher_suite as cs;
use rustls::SupportedCipherSuite;

/// TLS 1.3 suites by name.
const TLS13: &[(&str, SupportedCipherSuite)] = &[
    ("TLS_AES_128_GCM_SHA256", cs::TLS13_AES_128_GCM_SHA256),
    ("TLS_AES_256_GCM_SHA384", cs::TLS13_AES_256_GCM_SHA384),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        cs::TLS13_CHACHA20_POLY1305_SHA256,
    ),
];

/// OpenSSL's TLS 1.3 names that rustls does not offer.
const TLS13_NOT_OFFERED: &[&str] = &["TLS_AES_128_CCM_SHA256", "TLS_AES_128_CCM_8_SHA256"];

/// TLS 1.2 suites by OpenSSL's name, with what the keywords test:
/// (name, suite, RSA (else ECDSA) authentication, cipher).
const TLS12: &[(&str, SupportedCipherSuite, bool, &str)] = &[
    (
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        false,
        "AES256",
    ),
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        false,
        "AES128",
    ),
    (
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        false,
        "CHACHA20",
    ),
    (
        "ECDHE-RSA-AES256-GCM-SHA384",
        cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        true,
        "AES256",
    ),
    (
        "ECDHE-RSA-AES128-GCM-SHA256",
        cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        true,
        "AES128",
    ),
    (
        "ECDHE-RSA-CHACHA20-POLY1305",
        cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        true,
        "CHACHA20",
    ),
];

/// OpenSSL keywords that select only suites rustls never offers (no
/// authentication, no encryption, MD5, RC4, DES, export grade, CBC with
/// SHA-1, RSA or DH key exchange, PSK, SRP, other ciphers): they select
/// nothing here, and removing them removes nothing.
const NOTHING_HERE: &[&str] = &[
    "aNULL",
    "eNULL",
    "NULL",
    "COMPLEMENTOFDEFAULT",
    "COMPLEMENTOFALL",
    "MD5",
    "RC4",
    "DES",
    "3DES",
    "EXPORT",
    "EXP",
    "LOW",
    "MEDIUM",
    "SSLv3",
    "TLSv1",
    "TLSv1.0",
    "kRSA",
    "RSA",
    "DH",
    "DHE",
    "EDH",
    "kDHE",
    "kEDH",
    "ADH",
    "AECDH",
    "aDSS",
    "DSS",
    "PSK",
    "kPSK",
    "ECDHEPSK",
    "DHEPSK",
    "RSAPSK",
    "SRP",
    "kSRP",
    "CAMELLIA",
    "ARIA",
    "SEED",
    "IDEA",
    "RC2",
    "SHA1",
    "SHA",
    "AESCCM",
    "AESCCM8",
    "kECDH",
    "ECDH",
    "aECDH",
    "GOST94",
    "GOST89MAC",
    "SUITEB128",
    "SUITEB192",
    "SUITEB128ONLY",
    "CBC",
];

fn keyword(word: &str, rsa: bool, cipher: &str) -> Option<bool> {
    Some(match word {
        "DEFAULT" | "ALL" | "HIGH" | "ECDHE" | "EECDH" | "kECDHE" | "kEECDH" | "AEAD"
        | "TLSv1.2" | "FIPS" => true,
        "aRSA" => rsa,
        "aECDSA" | "ECDSA" => !rsa,
        "AESGCM" | "AES" => cipher != "CHACHA20",
        "AES128" | "SHA256" => cipher == "AES128",
        "AES256" | "SHA384" => cipher == "AES256",
        "CHACHA20" => cipher == "CHACHA20",
        w if NOTHING_HERE.contains(&w) => false,
        _ => return None,
    })
}

fn names12() -> String {
    TLS12.iter().map(|t| t.0).collect::<Vec<_>>().join(", ")
}

fn names13() -> String {
    TLS13.iter().map(|t| t.0).collect::<Vec<_>>().join(", ")
}

/// The TLS 1.2 suites (indexes into [`TLS12`]) one word selects: a name,
/// a keyword, or several joined by `+`.
fn select(word: &str) -> Result<Vec<usize>, String> {
    let mut set: Vec<usize> = (0..TLS12.len()).collect();
    for part in word.split('+') {
        let named = TLS12
            .iter()
            .position(|t| t.0 == part || t.1.suite().as_str() == Some(part));
        set.retain(|&i| match named {
            Some(n) => i == n,
            None => keyword(part, TLS12[i].2, TLS12[i].3).unwrap_or(false),
        });
        if named.is_none() && keyword(part, false, "").is_none() {
            return Err(format!(
                "'{part}' is neither a TLS 1.2 cipher suite this TLS library offers \
                 ({}) nor an OpenSSL keyword it knows (HIGH, ECDHE, AESGCM, CHACHA20, \
                 aRSA, aECDSA, ...; see 3proxy.cfg(5))",
                names12()
            ));
        }
    }
    Ok(set)
}

/// `ssl_*_cipher_list LIST`: the TLS 1.2 suites, in order. An empty
/// result is an error (TLS 1.2 would be left with no suite).
pub fn cipher_list(list: &str) -> Result<Vec<SupportedCipherSuite>, String> {
    let mut order: Vec<usize> = Vec::new();
    let mut banned: Vec<usize> = Vec::new();
    for w in list.split([':', ',', ' ']).filter(|w| !w.is_empty()) {
        if w.starts_with('@') {
            continue;
        }
        let (op, term) = match w.as_bytes()[0] {
            b'!' | b'-' | b'+' => (w.as_bytes()[0], &w[1..]),
            _ => (0, w),
        };
        let set = select(term)?;
        match op {
            b'!' => {
                order.retain(|i| !set.contains(i));
                banned.extend(&set);
            }
            b'-' => order.retain(|i| !set.contains(i)),
            b'+' => {
                let (moved, stay): (Vec<usize>, Vec<usize>) =
                    order.iter().partition(|i| set.contains(i));
                order = stay;
                order.extend(moved);
            }
            _ => {
                for i in set {
                    if !order.contains(&i) && !banned.contains(&i) {
                        order.push(i);
                    }
                }
            }
        }
    }
    if order.is_empty() {
        return Err(format!(
            "'{list}' selects no TLS 1.2 cipher suite this TLS library offers ({})",
            names12()
        ));
    }
    Ok(order.into_iter().map(|i| TLS12[i].1).collect())
}

/// `ssl_*_ciphersuites LIST`: the TLS 1.3 suites, in order. An empty
/// list leaves TLS 1.3 with none, as in OpenSSL: the version is then off.
pub fn ciphersuites(list: &str) -> Result<Vec<SupportedCipherSuite>, String> {
    let mut out = Vec::new();
    for w in list.split(':').filter(|w| !w.is_empty()) {
        let Some(s) = TLS13.iter().find(|t| t.0 == w).map(|t| t.1) else {
            return Err(if TLS13_NOT_OFFERED.contains(&w) {
                format!(
                    "'{w}' is not offered by this TLS library (TLS 1.3 has {})",
                    names13()
                )
            } else {
                format!(
                    "'{w}' is not a TLS 1.3 cipher suite (they are {}; TLS 1.2 suites \
                     go in ssl_*_cipher_list)",
                    names13()
                )
            });
        };
        if !out.contains(&s) {
            out.push(s);
        }
    }
    Ok(out)
}

/// The name OpenSSL gives `s` (IANA's for TLS 1.3).
#[cfg(test)]
fn name(s: &SupportedCipherSuite) -> &'static str {
    TLS13
        .iter()
        .find(|t| t.1 == *s)
        .map(|t| t.0)
        .or_else(|| TLS12.iter().find(|t| t.1 == *s).map(|t| t.0))
        .unwrap_or("?")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[SupportedCipherSuite]) -> Vec<&'static str> {
        v.iter().map(name).collect()
    }

    #[test]
    fn openssl_cipher_strings() {
        let all = cipher_list("HIGH:!aNULL:!MD5").unwrap();
        assert_eq!(all.len(), 6);
        assert_eq!(
            names(
                &cipher_list("ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305").unwrap()
            ),
            [
                "ECDHE-RSA-AES128-GCM-SHA256",
                "ECDHE-ECDSA-CHACHA20-POLY1305"
            ]
        );
        assert_eq!(
            names(&cipher_list("ECDHE+AESGCM+aECDSA").unwrap()),
            [
                "ECDHE-ECDSA-AES256-GCM-SHA384",
                "ECDHE-ECDSA-AES128-GCM-SHA256"
            ]
        );
        assert_eq!(
            names(&cipher_list("aRSA:!AES256:@STRENGTH").unwrap()),
            ["ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-CHACHA20-POLY1305"]
        );
        // `!` is for good, `-` only until named again; `+` moves to the end.
        assert_eq!(
            names(&cipher_list("!CHACHA20:aECDSA").unwrap()),
            [
                "ECDHE-ECDSA-AES256-GCM-SHA384",
                "ECDHE-ECDSA-AES128-GCM-SHA256"
            ]
        );
        assert_eq!(cipher_list("aECDSA:-CHACHA20:CHACHA20").unwrap().len(), 4);
        assert_eq!(
            names(&cipher_list("aECDSA+AESGCM:+AES256").unwrap()),
            [
                "ECDHE-ECDSA-AES128-GCM-SHA256",
                "ECDHE-ECDSA-AES256-GCM-SHA384"
            ]
        );
        // IANA's names too.
        assert_eq!(
            cipher_list("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256")
                .unwrap()
                .len(),
            1
        );
        for bad in ["RC4-SHA", "AES128-SHA", "NOSUCH"] {
            let e = cipher_list(bad).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{e}");
        }
        let e = cipher_list("MEDIUM:RC4").unwrap_err();
        assert!(e.contains("selects no TLS 1.2 cipher suite"), "{e}");
    }

    #[test]
    fn tls13_names() {
        assert_eq!(
            names(&ciphersuites("TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256").unwrap()),
            ["TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_128_GCM_SHA256"]
        );
        assert!(ciphersuites("").unwrap().is_empty());
        let e = ciphersuites("TLS_AES_128_CCM_SHA256").unwrap_err();
        assert!(e.contains("not offered"), "{e}");
        let e = ciphersuites("ECDHE-RSA-AES128-GCM-SHA256").unwrap_err();
        assert!(e.contains("not a TLS 1.3 cipher suite"), "{e}");
    }
}
