//! `make install` lays out what a 3proxy installation has: the binary, the
//! man pages, a sample cfg (never over an existing one) and init scripts
//! pointing at the installed paths. The binary step is given the debug
//! binary (CARGO=true skips the release build) so the test stays fast.

use std::fs;
use std::process::Command;

use crate::util::{Dir, BIN};

fn make(dest: &std::path::Path, targets: &[&str]) -> std::process::Output {
    let root = env!("CARGO_MANIFEST_DIR");
    Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(root)
        .args(targets)
        .arg(format!("DESTDIR={}", dest.display()))
        .arg(format!("BIN={BIN}"))
        .arg("CARGO=true")
        .output()
        .expect("make runs")
}

#[test]
fn make_install_lays_out_every_file() {
    let dir = Dir::new("make_install");
    let dest = dir.join("root");
    let out = make(&dest, &["install"]);
    assert!(
        out.status.success(),
        "make install failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [
        "usr/local/bin/3proxy",
        "usr/local/share/man/man8/3proxy.8",
        "usr/local/share/man/man5/3proxy.cfg.5",
        "usr/local/share/man/man8/3proxy_crypt.8",
        "etc/3proxy/3proxy.cfg",
        "lib/systemd/system/3proxy.service",
        "etc/init.d/3proxy",
    ] {
        assert!(dest.join(f).is_file(), "{f} not installed");
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = |f: &str| fs::metadata(dest.join(f)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode("usr/local/bin/3proxy"), 0o755);
    assert_eq!(mode("etc/init.d/3proxy"), 0o755);

    for name in [
        "3proxy_proxy",
        "3proxy_socks",
        "3proxy_pop3p",
        "3proxy_ftppr",
        "3proxy_imapp",
        "3proxy_smtpp",
        "3proxy_tcppm",
        "3proxy_udppm",
        "3proxy_tlspr",
    ] {
        let link = fs::read_link(dest.join("usr/local/bin").join(name)).expect(name);
        assert_eq!(link, std::path::Path::new("3proxy"), "{name}");
    }
    // 3proxy_crypt is the same binary under another name.
    let link = fs::read_link(dest.join("usr/local/bin/3proxy_crypt")).expect("3proxy_crypt link");
    assert_eq!(link, std::path::Path::new("3proxy"));
    let out = Command::new(dest.join("usr/local/bin/3proxy_crypt"))
        .arg("secret")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "NT:878D8014606CDA29677A44EFA1353FC7"
    );

    // The init scripts name the installed binary and cfg, not placeholders.
    let unit = fs::read_to_string(dest.join("lib/systemd/system/3proxy.service")).unwrap();
    assert!(!unit.contains('@'), "placeholder left in the unit:\n{unit}");
    assert!(
        unit.contains("ExecStart=/usr/local/bin/3proxy ${CONFIGFILE}"),
        "{unit}"
    );
    assert!(unit.contains("CONFIGFILE=/etc/3proxy/3proxy.cfg"), "{unit}");
    let init = fs::read_to_string(dest.join("etc/init.d/3proxy")).unwrap();
    assert!(init.contains("DAEMON=/usr/local/bin/3proxy"), "{init}");
    assert!(!init.contains("@BINDIR@") && !init.contains("@SYSCONFDIR@"));

    // The installed sample cfg passes the installed binary's check.
    let check = Command::new(dest.join("usr/local/bin/3proxy"))
        .arg("-t")
        .arg(dest.join("etc/3proxy/3proxy.cfg"))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    // A second install keeps the administrator's cfg.
    fs::write(dest.join("etc/3proxy/3proxy.cfg"), "# mine\n").unwrap();
    let out = make(&dest, &["install-etc"]);
    assert!(out.status.success());
    assert_eq!(
        fs::read_to_string(dest.join("etc/3proxy/3proxy.cfg")).unwrap(),
        "# mine\n"
    );

    // And uninstall removes what install put there, except the cfg.
    let out = make(&dest, &["uninstall"]);
    assert!(out.status.success());
    assert!(!dest.join("usr/local/bin/3proxy").exists());
    assert!(!dest.join("usr/local/bin/3proxy_crypt").exists());
    assert!(!dest.join("lib/systemd/system/3proxy.service").exists());
    assert!(dest.join("etc/3proxy/3proxy.cfg").exists());
}

#[test]
fn install_honours_prefix() {
    let dir = Dir::new("make_install_prefix");
    let dest = dir.join("root");
    let out = make(
        &dest,
        &[
            "install-bin",
            "install-man",
            "install-init",
            "PREFIX=/opt/tp",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dest.join("opt/tp/bin/3proxy").is_file());
    assert!(dest.join("opt/tp/share/man/man8/3proxy.8").is_file());
    let unit = fs::read_to_string(dest.join("lib/systemd/system/3proxy.service")).unwrap();
    assert!(unit.contains("ExecStart=/opt/tp/bin/3proxy"), "{unit}");
}

/// Runs `3proxy -t` without a cfg argument in a mount namespace whose
/// /etc and /usr/local are empty, after the shell commands `setup`;
/// returns the exit code and stderr. The host's files do not count.
fn bare_check(setup: &str) -> (Option<i32>, String) {
    let script =
        format!("mount -t tmpfs t /etc && mount -t tmpfs t /usr/local && {setup} exec {BIN} -t");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("unshare(1) from util-linux, as root");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Without a cfg argument, 3proxy reads 3proxy's default,
/// /usr/local/etc/3proxy/3proxy.cfg, and when that is absent the cfg
/// `make install` wrote, /etc/3proxy/3proxy.cfg; with neither, the message
/// names both.
#[test]
fn bare_3proxy_finds_the_installed_cfg() {
    const GOOD: &str = "echo 'tcppm -i127.0.0.1 1080 127.0.0.1 1' >";
    let installed = "mkdir /etc/3proxy && ";
    let (code, err) = bare_check(&format!("{installed}{GOOD} /etc/3proxy/3proxy.cfg &&"));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("/etc/3proxy/3proxy.cfg: the configuration is good"),
        "{err}"
    );

    let both = format!(
        "{installed}echo nonsense > /etc/3proxy/3proxy.cfg && \
         mkdir -p /usr/local/etc/3proxy && {GOOD} /usr/local/etc/3proxy/3proxy.cfg &&"
    );
    let (code, err) = bare_check(&both);
    assert_eq!(code, Some(0), "3proxy's own default comes first: {err}");
    assert!(
        err.contains("/usr/local/etc/3proxy/3proxy.cfg: the configuration is good"),
        "{err}"
    );

    let (code, err) = bare_check("");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("/usr/local/etc/3proxy/3proxy.cfg: No such file")
            && err.contains("/etc/3proxy/3proxy.cfg: No such file"),
        "{err}"
    );
}

/// The README's install paragraph names every link `make install` makes,
/// and says how many there are.
#[test]
fn readme_names_every_installed_link() {
    let dir = Dir::new("make_install_links");
    let dest = dir.join("root");
    let out = make(&dest, &["install-bin"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = dest.join("usr/local/bin");
    let mut links: Vec<String> = fs::read_dir(&bin)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_symlink())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    links.sort();
    assert_eq!(links.len(), 10, "{links:?}");
    let readme = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README")).unwrap();
    let start = readme
        .find("`make install` puts")
        .expect("the install paragraph");
    let para = &readme[start..start + readme[start..].find("\n\n").unwrap()];
    assert!(para.contains("ten links"), "{para}");
    for l in &links {
        assert!(
            para.contains(&format!("`{l}`")),
            "README does not name {l}:\n{para}"
        );
    }
}
