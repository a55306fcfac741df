//! Windows-1251 for the utf8tocp1251 plugin (3proxy's
//! src/plugins/utf8tocp1251). Its users keep `users` passwords and names
//! in Windows-1251 while their clients send UTF-8; 3proxy recodes the
//! client's UTF-8 to Windows-1251 and compares bytes. Here text is
//! Unicode: with the plugin loaded the cfg's lines that are not UTF-8 are
//! read as Windows-1251, and a client's login bytes that are not UTF-8
//! as Windows-1251 too, so both sides meet as the same text. The encoding
//! tables are encoding_rs's.
//!
//! Client threads never call encoding_rs: its decoder's frames outgrow a
//! client thread's small stack in a debug build. The 128 characters of
//! the upper half are taken from it once, on the thread loading the cfg.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The running cfg loads utf8tocp1251.
static LOADED: AtomicBool = AtomicBool::new(false);

/// Windows-1251's bytes 0x80-0xFF, as encoding_rs reads them.
static UPPER: OnceLock<[char; 128]> = OnceLock::new();

/// Set by each load of the cfg (a reload without the plugin clears it).
pub fn set_cp1251(on: bool) {
    if on {
        UPPER.get_or_init(|| {
            let mut t = ['\u{fffd}'; 128];
            for (i, c) in t.iter_mut().enumerate() {
                let b = [0x80 + i as u8];
                *c = cp1251(&b).chars().next().unwrap_or('\u{fffd}');
            }
            t
        });
    }
    LOADED.store(on, Ordering::Relaxed);
}

/// A client's user name or password as text: UTF-8 as it is; other bytes
/// as Windows-1251 when the plugin is loaded, else with U+FFFD for each
/// byte that is not UTF-8 (a password that cannot match one in the cfg).
pub fn login_text(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_owned(),
        Err(_) if LOADED.load(Ordering::Relaxed) => match UPPER.get() {
            Some(upper) => b
                .iter()
                .map(|&c| match c {
                    0..=0x7f => char::from(c),
                    _ => upper[usize::from(c - 0x80)],
                })
                .collect(),
            None => String::from_utf8_lossy(b).into_owned(),
        },
        Err(_) => String::from_utf8_lossy(b).into_owned(),
    }
}

/// `b` read as Windows-1251 (every byte is a character of it). Not for
/// client threads (see the module's note).
pub fn cp1251(b: &[u8]) -> Cow<'_, str> {
    encoding_rs::WINDOWS_1251.decode_without_bom_handling(b).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_1251_reads_cyrillic() {
        // "пароль" in Windows-1251, and Ё/ё at 0xA8/0xB8.
        assert_eq!(cp1251(b"\xef\xe0\xf0\xee\xeb\xfc"), "пароль");
        assert_eq!(cp1251(b"\xa8\xb8 ok"), "Ёё ok");
    }

    #[test]
    fn login_bytes_are_utf8_first() {
        set_cp1251(false);
        assert_eq!(login_text("пароль".as_bytes()), "пароль");
        assert_eq!(login_text(b"\xef\xe0"), "\u{fffd}\u{fffd}");
        set_cp1251(true);
        assert_eq!(login_text("пароль".as_bytes()), "пароль");
        assert_eq!(login_text(b"\xef\xe0\xf0\xee\xeb\xfc"), "пароль");
        set_cp1251(false);
    }
}
