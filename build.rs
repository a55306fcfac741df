//! Build script: one link argument, for the ODBC log (`log &DSN`).
//!
//! unixODBC's driver manager is compiled into the binary (odbc-sys's
//! `vendored-unix-odbc`), and it loads a driver that odbcinst.ini names
//! without a directory (`Driver=libsqlite3odbc.so`, `psqlodbcw.so`: how
//! Debian's driver packages write it) with a plain dlopen. The system's
//! libodbc finds such a name in its module directory; the built-in one
//! has none. dlopen also searches the RUNPATH of the object that calls
//! it, here the binary: so the binary's RUNPATH names the distributions'
//! ODBC module directories. Directories that do not exist cost nothing,
//! and nothing in them is loaded unless a `log &` target connects.

use std::env;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    // Debian's multiarch names.
    let triplet = match arch.as_str() {
        "x86_64" => Some("x86_64-linux-gnu"),
        "aarch64" => Some("aarch64-linux-gnu"),
        "x86" => Some("i386-linux-gnu"),
        "riscv64" => Some("riscv64-linux-gnu"),
        "powerpc64" => Some("powerpc64le-linux-gnu"),
        "s390x" => Some("s390x-linux-gnu"),
        _ => None,
    };
    let mut dirs = Vec::new();
    if let Some(t) = triplet {
        dirs.push(format!("/usr/lib/{t}/odbc"));
    }
    dirs.push("/usr/lib64/odbc".into());
    dirs.push("/usr/lib/odbc".into());
    println!(
        "cargo:rustc-link-arg-bins=-Wl,--enable-new-dtags,-rpath,{}",
        dirs.join(":")
    );
}
