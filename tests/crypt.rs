//! `3proxy_crypt`: the same binary under another name prints password
//! hashes. Expected lines were printed by 3proxy's own 3proxy_crypt.

use std::process::{Command, Output};

use crate::util::*;

/// Run the binary through a `3proxy_crypt` symlink in `dir`.
fn crypt(dir: &Dir, args: &[&str]) -> Output {
    let link = dir.join("3proxy_crypt");
    if !link.exists() {
        std::os::unix::fs::symlink(BIN, &link).expect("symlink 3proxy_crypt");
    }
    Command::new(&link)
        .args(args)
        .output()
        .expect("run 3proxy_crypt")
}

fn stdout_of(dir: &Dir, args: &[&str]) -> String {
    let out = crypt(dir, args);
    assert!(out.status.success(), "3proxy_crypt {args:?}: {out:?}");
    assert!(out.stderr.is_empty(), "3proxy_crypt {args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

#[test]
fn prints_nt_hashes() {
    let dir = Dir::new("crypt-nt");
    for (pw, line) in [
        ("password", "NT:8846F7EAEE8FB117AD06BDD830B7586C\n"),
        ("", "NT:31D6CFE0D16AE931B73C59D7E0C089C0\n"),
        ("Пароль", "NT:BFFD3CEA063C21E339F3207C64407F95\n"),
    ] {
        assert_eq!(stdout_of(&dir, &[pw]), line, "{pw:?}");
    }
}

#[test]
fn prints_blake2_crypt() {
    let dir = Dir::new("crypt-cr");
    let long_salt = "s".repeat(70);
    let cut = "s".repeat(64);
    for (salt, pw, line) in [
        (
            "salt",
            "password",
            "CR:$3$salt$yCFxAkLdiC9UiJY4yH5Qm/\n".to_string(),
        ),
        (
            "MySalt",
            "password",
            "CR:$3$MySalt$d6qrVG0Y3fZcI2bWVZH1n0\n".into(),
        ),
        ("", "", "CR:$3$$lMDQkrQ7qBCsUlQRWLEpO.\n".into()),
        (
            "ab$cd",
            "password",
            "CR:$3$ab$SmGD61THgivHmhq3dJtLU0\n".into(),
        ),
        (
            &long_salt,
            "password",
            format!("CR:$3${cut}$5FFeRmTJHXfM405OCrE9q1\n"),
        ),
    ] {
        assert_eq!(stdout_of(&dir, &[salt, pw]), line, "{salt:?} {pw:?}");
    }
}

#[test]
fn wrong_argument_count_prints_usage_and_exits_1() {
    let dir = Dir::new("crypt-usage");
    for args in [&[][..], &["a", "b", "c"][..]] {
        let out = crypt(&dir, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("SALT PASSWORD"),
            "{out:?}"
        );
    }
}

#[test]
fn the_3proxy_name_is_still_the_proxy() {
    // Only a name ending in 3proxy_crypt selects the tool.
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("threeproxy"));
}
