//! The sample cfg shipped in cfg/ (what `make run` and `make install` use)
//! starts a working HTTP and SOCKS proxy on loopback only. The test runs it
//! with its two ports moved to free ones, so it can run beside other tests.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::process::Command;

use crate::util::*;

#[test]
fn sample_cfg_serves_http_and_socks_on_loopback() {
    let dir = Dir::new("sample_cfg");
    let sample = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/cfg/3proxy.cfg"))
        .expect("cfg/3proxy.cfg");
    assert!(
        sample.contains("\ninternal 127.0.0.1\n"),
        "the sample must listen on loopback only"
    );
    let (hp, sp) = (free_port(), free_port());
    let cfg = sample
        .replace("proxy -p3128", &format!("proxy -p{hp}"))
        .replace("socks -p1080", &format!("socks -p{sp}"));
    assert_ne!(cfg, sample, "the sample's proxy ports moved");
    let origin = Origin::start("127.0.0.1:0", |mut conn| {
        let mut buf = [0u8; 4096];
        let _ = conn.read(&mut buf);
        let _ = conn
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nsample");
        let _ = conn.shutdown(Shutdown::Both);
    });
    let _proxy = Proxy::start(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(hp)), Listen::Tcp(localhost(sp))],
    );
    let url = format!("http://127.0.0.1:{}/", origin.port());
    for via in [
        format!("http://127.0.0.1:{hp}"),
        format!("socks5h://127.0.0.1:{sp}"),
    ] {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "10", "-x", &via, &url])
            .output()
            .expect("run curl");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "sample",
            "through {via}"
        );
    }
    // The listeners are bound to 127.0.0.1, not to every address: the
    // kernel's socket table says so (state 0A is LISTEN).
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    for port in [hp, sp] {
        let suffix = format!(":{port:04X}");
        let bound: Vec<&str> = table
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() > 3 && f[1].ends_with(&suffix) && f[3] == "0A").then_some(f[1])
            })
            .collect();
        assert_eq!(
            bound,
            [format!("0100007F{suffix}")],
            "listener of port {port}"
        );
    }
}
