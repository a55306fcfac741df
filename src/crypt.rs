//! Password hashes, and the `3proxy_crypt` tool that prints them
//! (3proxy's 3proxy_crypt.c; man page 3proxy_crypt(8)).
//!
//! `users` accepts three hashed forms, all made here:
//! - `NT:<32 hex>`: MD4 over the password widened to 16-bit units. Each
//!   *byte* becomes one unit (so this is UTF-16LE only for ASCII), and at
//!   most 255 bytes count; 3proxy does it that way and hashes must match.
//! - `CR:$1$salt$hash`: FreeBSD's MD5-crypt (1000 rounds).
//! - `CR:$3$salt$hash`: 3proxy's own: BLAKE2b with a 16-byte digest over
//!   the password, its terminating NUL, then the salt.
//!
//! Both crypt forms print their 16-byte digest as 22 characters of the
//! crypt(3) alphabet, in MD5-crypt's byte order. The salt is the text
//! between the magic and the next `$`.
//!
//! The tool is this same binary run under a name ending in `3proxy_crypt`
//! (`make install` puts a symlink next to `3proxy`): `main` checks argv[0]
//! before anything else and calls [`crypt_main`].

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;

use md5::{Digest, Md5};

/// Bytes of the password the NT hash uses (3proxy's limit).
const NT_MAX_PASSWORD: usize = 255;
/// Bytes of salt `3proxy_crypt SALT PASSWORD` keeps.
const CLI_MAX_SALT: usize = 64;

/// The NT hash of a password: MD4 of each byte widened to a little-endian
/// 16-bit unit, over at most the first 255 bytes.
pub fn nt_hash(pw: impl AsRef<[u8]>) -> [u8; 16] {
    let wide: Vec<u8> = pw
        .as_ref()
        .iter()
        .take(NT_MAX_PASSWORD)
        .flat_map(|&b| [b, 0])
        .collect();
    let mut h = md4::Md4::new();
    md4::Digest::update(&mut h, &wide);
    h.finalize().into()
}

/// [`nt_hash`] as the 32 uppercase hex digits `users ...:NT:` takes.
pub fn nt_hex(pw: impl AsRef<[u8]>) -> String {
    nt_hash(pw).iter().map(|b| format!("{b:02X}")).collect()
}

/// Hash `pw` as `setting` says: `setting` is a stored `$1$salt$hash` or
/// `$3$salt$hash`, or just its `$1$salt$` / `$3$salt$` head. The result
/// is the whole crypt string, to compare with the stored one. None for
/// any other form, or when no `$` ends the salt.
pub fn crypt(pw: impl AsRef<[u8]>, setting: impl AsRef<[u8]>) -> Option<Vec<u8>> {
    let setting = setting.as_ref();
    let magic = setting.get(..3)?;
    let rest = &setting[3..];
    let salt = &rest[..rest.iter().position(|&c| c == b'$')?];
    let pw = pw.as_ref();
    let digest = match magic {
        b"$1$" => md5_digest(pw, salt),
        b"$3$" => blake2_digest(pw, salt),
        _ => return None,
    };
    let mut out = Vec::with_capacity(3 + salt.len() + 1 + 22);
    out.extend_from_slice(magic);
    out.extend_from_slice(salt);
    out.push(b'$');
    encode64(&digest, &mut out);
    Some(out)
}

/// `$3$SALT$hash` for a salt with no `$` in it (a `$` would end the
/// salt early, as in [`crypt`]).
pub fn blake2_crypt(salt: impl AsRef<[u8]>, pw: impl AsRef<[u8]>) -> Vec<u8> {
    let salt = salt.as_ref();
    let salt = &salt[..salt.iter().position(|&c| c == b'$').unwrap_or(salt.len())];
    let mut out = b"$3$".to_vec();
    out.extend_from_slice(salt);
    out.push(b'$');
    encode64(&blake2_digest(pw.as_ref(), salt), &mut out);
    out
}

/// `$1$SALT$hash`, MD5-crypt, for a salt with no `$` in it.
#[allow(dead_code)] // `users` verifies through `crypt`; kept for tools and tests
pub fn md5_crypt(salt: impl AsRef<[u8]>, pw: impl AsRef<[u8]>) -> Vec<u8> {
    let salt = salt.as_ref();
    let salt = &salt[..salt.iter().position(|&c| c == b'$').unwrap_or(salt.len())];
    let mut out = b"$1$".to_vec();
    out.extend_from_slice(salt);
    out.push(b'$');
    encode64(&md5_digest(pw.as_ref(), salt), &mut out);
    out
}

fn blake2_digest(pw: &[u8], salt: &[u8]) -> [u8; 16] {
    use blake2::digest::{Update, VariableOutput};
    let mut out = [0u8; 16];
    // 16 is a valid BLAKE2b output length, and `out` is exactly that long,
    // so neither call can fail.
    if let Ok(mut h) = blake2::Blake2bVar::new(out.len()) {
        h.update(pw);
        h.update(&[0]);
        h.update(salt);
        let _ = h.finalize_variable(&mut out);
    }
    out
}

/// The MD5-crypt digest (Poul-Henning Kamp's scheme, as in FreeBSD and
/// glibc). Every salt byte counts: 3proxy does not cut it at 8.
fn md5_digest(pw: &[u8], salt: &[u8]) -> [u8; 16] {
    let alternate: [u8; 16] = Md5::new()
        .chain_update(pw)
        .chain_update(salt)
        .chain_update(pw)
        .finalize()
        .into();
    let mut ctx = Md5::new()
        .chain_update(pw)
        .chain_update(b"$1$")
        .chain_update(salt);
    for chunk in pw.chunks(16) {
        ctx.update(&alternate[..chunk.len()]);
    }
    // One byte per bit of the length, low bit first: a NUL for a set bit,
    // the password's first byte for a clear one.
    let mut n = pw.len();
    while n > 0 {
        if n & 1 == 1 {
            ctx.update([0u8]);
        } else {
            ctx.update(&pw[..1]);
        }
        n >>= 1;
    }
    let mut d: [u8; 16] = ctx.finalize().into();
    // The 1000 rounds that make a dictionary slow to build.
    for round in 0..1000 {
        let mut c = Md5::new();
        if round % 2 == 1 {
            c.update(pw);
        } else {
            c.update(d);
        }
        if round % 3 != 0 {
            c.update(salt);
        }
        if round % 7 != 0 {
            c.update(pw);
        }
        if round % 2 == 1 {
            c.update(d);
        } else {
            c.update(pw);
        }
        d = c.finalize().into();
    }
    d
}

/// Append a 16-byte digest as 22 characters of crypt(3)'s base64: five
/// groups of three bytes (taken in MD5-crypt's interleaved order) give
/// four characters each, least significant six bits first; the last byte
/// gives two.
fn encode64(d: &[u8; 16], out: &mut Vec<u8>) {
    const ALPHABET: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    const GROUPS: [[usize; 3]; 5] = [[0, 6, 12], [1, 7, 13], [2, 8, 14], [3, 9, 15], [4, 10, 5]];
    let mut put = |mut v: u32, n: usize| {
        for _ in 0..n {
            out.push(ALPHABET[(v & 0x3f) as usize]);
            v >>= 6;
        }
    };
    for [a, b, c] in GROUPS {
        put(
            u32::from(d[a]) << 16 | u32::from(d[b]) << 8 | u32::from(d[c]),
            4,
        );
    }
    put(u32::from(d[11]), 2);
}

/// Whether this process was started as the `3proxy_crypt` tool.
pub fn invoked_as_crypt(argv0: Option<&std::ffi::OsStr>) -> bool {
    argv0
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n.as_bytes().ends_with(b"3proxy_crypt"))
}

/// `3proxy_crypt PASSWORD` prints `NT:<hex>`; `3proxy_crypt SALT
/// PASSWORD` prints `CR:$3$SALT$hash` (the salt cut to 64 bytes and at
/// its first `$`). Anything else prints usage and exits 1. Arguments are
/// taken as bytes, so hashes of non-UTF-8 passwords match 3proxy's too.
pub fn crypt_main(args: Vec<OsString>) -> ExitCode {
    let name = args
        .first()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_else(|| "3proxy_crypt".into());
    let line = match args.get(1..).unwrap_or_default() {
        [pw] => {
            let mut v = b"NT:".to_vec();
            v.extend_from_slice(nt_hex(pw.as_bytes()).as_bytes());
            v
        }
        [salt, pw] => {
            let salt = salt.as_bytes();
            let salt = &salt[..salt.len().min(CLI_MAX_SALT)];
            let mut v = b"CR:".to_vec();
            v.extend_from_slice(&blake2_crypt(salt, pw.as_bytes()));
            v
        }
        _ => {
            eprintln!(
                "Usage: {name} PASSWORD\n       {name} SALT PASSWORD\n\n\
                 With one argument, prints the password's NT hash (NT:...).\n\
                 With two, prints its salted BLAKE2b crypt (CR:$3$SALT$...).\n\
                 Either line can follow 'user:' in a 3proxy 'users' command."
            );
            return ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout().lock();
    match out
        .write_all(&line)
        .and_then(|_| out.write_all(b"\n"))
        .and_then(|_| out.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cr(salt: &str, pw: &str) -> String {
        String::from_utf8(blake2_crypt(salt, pw)).unwrap()
    }

    // Expected values below were printed by 3proxy's own 3proxy_crypt
    // (built from 3proxy 1.0.0), and by `openssl passwd -1` for `$1$`.

    #[test]
    fn nt_hashes_match_3proxy() {
        for (pw, hex) in [
            ("", "31D6CFE0D16AE931B73C59D7E0C089C0"),
            ("a", "186CB09181E2C2ECAAC768C47C729904"),
            ("password", "8846F7EAEE8FB117AD06BDD830B7586C"),
            // Not UTF-16: each UTF-8 byte is widened on its own.
            ("Пароль", "BFFD3CEA063C21E339F3207C64407F95"),
        ] {
            assert_eq!(nt_hex(pw), hex, "{pw}");
        }
        // Only the first 255 bytes count.
        assert_eq!(nt_hex("x".repeat(300)), "771D44223023D3B5D14C72F4E7D14938");
        assert_eq!(nt_hex("x".repeat(300)), nt_hex("x".repeat(255)));
    }

    #[test]
    fn blake2_crypt_matches_3proxy() {
        for (salt, pw, want) in [
            ("", "", "$3$$lMDQkrQ7qBCsUlQRWLEpO."),
            ("", "password", "$3$$qfw1OU4rmsdXLfu.uKiuR."),
            ("salt", "", "$3$salt$Lg2o.Uqie/rO8a7omQro60"),
            ("salt", "password", "$3$salt$yCFxAkLdiC9UiJY4yH5Qm/"),
            ("salt", "p@ss w0rd!", "$3$salt$NvDJvDW3TgizD8MCZl/cN."),
            ("salt", "Пароль", "$3$salt$16Z3yP8PUCdcYpIj28z3G1"),
            ("MySalt", "password", "$3$MySalt$d6qrVG0Y3fZcI2bWVZH1n0"),
            ("соль", "Пароль", "$3$соль$twYOLwH.usy7tVJwflDXD/"),
            // A `$` ends the salt.
            ("ab$cd", "password", "$3$ab$SmGD61THgivHmhq3dJtLU0"),
        ] {
            assert_eq!(cr(salt, pw), want, "{salt} {pw}");
        }
    }

    #[test]
    fn md5_crypt_matches_openssl() {
        assert_eq!(
            md5_crypt("saltsalt", "password"),
            b"$1$saltsalt$qjXMvbEw8oaL.CzflDtaK/"
        );
        assert_eq!(md5_crypt("ab", "").len(), 3 + 2 + 1 + 22);
    }

    #[test]
    fn crypt_checks_stored_hashes() {
        let stored = b"$3$salt$yCFxAkLdiC9UiJY4yH5Qm/";
        assert_eq!(crypt("password", stored).unwrap(), stored);
        assert_ne!(crypt("Password", stored).unwrap(), stored);
        let stored = b"$1$saltsalt$qjXMvbEw8oaL.CzflDtaK/";
        assert_eq!(crypt("password", stored).unwrap(), stored);
        assert_eq!(crypt("password", "$1$saltsalt$").unwrap(), stored);
        for bad in ["", "$1", "$1$nodollar", "$2$salt$x", "plain"] {
            assert_eq!(crypt("password", bad), None, "{bad}");
        }
    }

    #[test]
    fn argv0_selects_the_tool() {
        use std::ffi::OsStr;
        assert!(invoked_as_crypt(Some(OsStr::new("3proxy_crypt"))));
        assert!(invoked_as_crypt(Some(OsStr::new(
            "/usr/local/bin/3proxy_crypt"
        ))));
        assert!(!invoked_as_crypt(Some(OsStr::new("/usr/local/bin/3proxy"))));
        assert!(!invoked_as_crypt(Some(OsStr::new("3proxy_crypt/3proxy"))));
        assert!(!invoked_as_crypt(None));
    }
}
