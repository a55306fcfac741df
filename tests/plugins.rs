//! `plugin` lines: the plugins 3proxy ships, built in. TransparentPlugin
//! behind a real iptables REDIRECT rule inside a network namespace the
//! test makes (the proxy listens in it, its outgoing side and the origins
//! stay here); PamAuth against the system PAM with a user and a service
//! file the test creates; a plugin that is not built refused by name.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::process::{Command, Stdio};

use crate::socks::http_origin;
use crate::util::*;

/// Service, code, host, destination asked for, server reached, text.
const FMT: &str = "L%N %E %n %Q:%q %R:%r %T";

/// A network namespace with loopback up, in which connections to
/// 127.0.0.1:`from` are redirected (iptables nat OUTPUT REDIRECT) to port
/// `to`, where a service listening inside (`-ni`) gets them. Removed on
/// drop.
struct Redirecting(String);

impl Redirecting {
    fn new(tag: &str) -> Redirecting {
        let name = format!("tp-pl{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("run ip(8)");
        assert!(ok.success(), "ip netns add {name} failed (needs root)");
        let ns = Redirecting(name);
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    fn exec(&self, cmd: &[&str]) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(cmd)
            .output()
            .unwrap_or_else(|e| panic!("{cmd:?}: {e} (tests/deps.sh installs iptables)"));
        assert!(
            out.status.success(),
            "{cmd:?} in {}: {}",
            self.0,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn redirect(&self, from: u16, to: u16) {
        self.redirect_on("127.0.0.1", from, to);
    }

    /// [`Redirecting::redirect`] for connections to `ip` (IPv4 or IPv6).
    fn redirect_on(&self, ip: &str, from: u16, to: u16) {
        let (from, to) = (from.to_string(), to.to_string());
        let tables = if ip.contains(':') {
            "ip6tables"
        } else {
            "iptables"
        };
        self.exec(&[
            tables,
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "-d",
            ip,
            "--dport",
            &from,
            "-j",
            "REDIRECT",
            "--to-ports",
            &to,
        ]);
    }

    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.0)
    }

    /// A client inside the namespace: connect to `ip`:`port`, send
    /// `msg`, half-close, return everything that came back ("" if the
    /// connection failed).
    fn ask_at(&self, ip: &str, port: u16, msg: &[u8]) -> Vec<u8> {
        let code = format!(
            "import socket,sys\ntry:\n s=socket.create_connection(('{ip}',{port}),timeout=10)\nexcept OSError:\n sys.exit(0)\ns.sendall(bytes.fromhex('{}'))\ns.shutdown(socket.SHUT_WR)\nb=b''\nwhile True:\n d=s.recv(4096)\n if not d: break\n b+=d\nsys.stdout.buffer.write(b)",
            hex(msg)
        );
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "python3", "-c", &code])
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        out.stdout
    }

    /// [`Redirecting::ask_at`] until something comes back (the service in the
    /// namespace may not listen yet).
    fn ask_until_answered(&self, port: u16, msg: &[u8]) -> String {
        self.ask_until_answered_at("127.0.0.1", port, msg)
    }

    fn ask_until_answered_at(&self, ip: &str, port: u16, msg: &[u8]) -> String {
        let mut got = Vec::new();
        wait_for(
            || {
                got = self.ask_at(ip, port, msg);
                !got.is_empty()
            },
            START_TIMEOUT,
        );
        String::from_utf8_lossy(&got).into_owned()
    }
}

impl Drop for Redirecting {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An origin that answers every connection with `word` and closes.
fn says(word: &'static str) -> Origin {
    Origin::start("127.0.0.1:0", move |mut conn| {
        let mut b = [0u8; 256];
        let _ = conn.read(&mut b);
        let _ = conn.write_all(word.as_bytes());
        let _ = conn.shutdown(Shutdown::Both);
    })
}

const TRANSPARENT: &str = "plugin /nonexistent/TransparentPlugin.ld.so transparent_plugin\n";

#[test]
fn transparent_tcppm_goes_to_the_original_destination() {
    let ns = Redirecting::new("t");
    let meant = Origin::echo();
    let mapped = says("mapped");
    let port = free_port();
    ns.redirect(meant.port(), port);
    let body = format!(
        "{TRANSPARENT}tcppm -ni{} -i127.0.0.1 {port} 127.0.0.1 {}\n",
        ns.path(),
        mapped.port()
    );
    let (_proxy, log) = start(Dir::new("pl_tcppm"), FMT, &body, &[]);
    // The client dials the origin; the rule hands it to tcppm, which
    // connects it where it meant to go, not to its mapped destination.
    let got = ns.ask_until_answered(meant.port(), b"to the origin");
    assert_eq!(got, "to the origin");
    let m = meant.port();
    expect_log_line(
        &log,
        &format!("TCPPM 00000 127.0.0.1 127.0.0.1:{m} 127.0.0.1:{m} 127.0.0.1"),
    );
    // A client that comes straight to the port is mapped as usual.
    let got = ns.ask_until_answered(port, b"hi");
    assert_eq!(got, "mapped");
}

#[test]
fn transparent_tcppm_over_ipv6() {
    let ns = Redirecting::new("6");
    let meant = Origin::echo_on("[::1]:0");
    let port = free_port_v6();
    ns.redirect_on("::1", meant.port(), port);
    let body = format!(
        "{TRANSPARENT}tcppm -ni{} -i::1 {port} 127.0.0.1 1\n",
        ns.path()
    );
    let (_proxy, log) = start(Dir::new("pl_tcppm6"), FMT, &body, &[]);
    let got = ns.ask_until_answered_at("::1", meant.port(), b"over six");
    assert_eq!(got, "over six");
    let m = meant.port();
    let want = format!(" ::1:{m} ::1:{m} ");
    read_log_line(&log, &format!("with {want:?}"), |l| {
        l.starts_with("TCPPM 00000 ") && l.contains(&want)
    });
}

/// TPROXY: a client in one namespace connects over a veth pair to
/// 10.201.0.2:80 in another, where a TPROXY rule hands the connection,
/// unchanged, to tcppm's transparent listener on another port; tcppm
/// (its outgoing side in that namespace too) connects to 10.201.0.2:80,
/// where the origin listens.
#[test]
fn transparent_tcppm_behind_tproxy() {
    let a = Redirecting::new("a");
    let b = Redirecting::new("b");
    let id = std::process::id();
    let (va, vb) = (format!("tpa{id}"), format!("tpb{id}"));
    let ok = Command::new("ip")
        .args(["link", "add", &va, "type", "veth", "peer", "name", &vb])
        .status()
        .unwrap();
    assert!(ok.success(), "ip link add veth");
    for (v, ns) in [(&va, &a), (&vb, &b)] {
        let ok = Command::new("ip")
            .args(["link", "set", v, "netns", &ns.0])
            .status()
            .unwrap();
        assert!(ok.success(), "ip link set {v} netns");
    }
    a.exec(&["ip", "addr", "add", "10.201.0.1/24", "dev", &va]);
    a.exec(&["ip", "link", "set", &va, "up"]);
    b.exec(&["ip", "addr", "add", "10.201.0.2/24", "dev", &vb]);
    b.exec(&["ip", "link", "set", &vb, "up"]);
    let port = free_port();
    let p = port.to_string();
    b.exec(&[
        "iptables",
        "-t",
        "mangle",
        "-A",
        "PREROUTING",
        "-i",
        &vb,
        "-p",
        "tcp",
        "--dport",
        "80",
        "-j",
        "TPROXY",
        "--on-port",
        &p,
        "--tproxy-mark",
        "1",
    ]);
    let code = "import socket\nl=socket.socket()\nl.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\nl.bind(('10.201.0.2',80))\nl.listen()\nprint('up',flush=True)\nwhile True:\n c,_=l.accept()\n c.sendall(b'origin:'+c.recv(100))\n c.close()";
    let mut origin = Command::new("ip")
        .args(["netns", "exec", &b.0, "python3", "-c", code])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut up = [0u8; 3];
    origin.stdout.as_mut().unwrap().read_exact(&mut up).unwrap();
    let body = format!(
        "{TRANSPARENT}tcppm -ni{path} -ne{path} -olIP_TRANSPARENT {port} 127.0.0.1 1\n",
        path = b.path()
    );
    let (_proxy, log) = start(Dir::new("pl_tproxy"), FMT, &body, &[]);
    let got = a.ask_until_answered_at("10.201.0.2", 80, b"hello");
    let _ = origin.kill();
    let _ = origin.wait();
    assert_eq!(got, "origin:hello");
    expect_log_line(
        &log,
        "TCPPM 00000 10.201.0.2 10.201.0.2:80 10.201.0.2:80 10.201.0.2",
    );
}

#[test]
fn notransparent_keeps_later_services_mapped() {
    let ns = Redirecting::new("n");
    let meant = Origin::echo();
    let mapped = says("mapped");
    let port = free_port();
    ns.redirect(meant.port(), port);
    let body = format!(
        "{TRANSPARENT}notransparent\ntcppm -ni{} -i127.0.0.1 {port} 127.0.0.1 {}\n",
        ns.path(),
        mapped.port()
    );
    let (_proxy, _log) = start(Dir::new("pl_notransparent"), FMT, &body, &[]);
    let got = ns.ask_until_answered(meant.port(), b"to the origin");
    assert_eq!(got, "mapped");
}

#[test]
fn transparent_proxy_sends_a_plain_request_to_the_original_destination() {
    let ns = Redirecting::new("p");
    let origin = http_origin("127.0.0.1:0");
    let port = free_port();
    ns.redirect(origin.port(), port);
    let body = format!("{TRANSPARENT}proxy -ni{} -i127.0.0.1 -p{port}\n", ns.path());
    let (_proxy, log) = start(Dir::new("pl_proxy"), FMT, &body, &[]);
    let o = origin.port();
    // Host names no host that resolves: it only names the destination.
    let req = b"GET /page HTTP/1.1\r\nHost: site.invalid\r\nConnection: close\r\n\r\n";
    let got = ns.ask_until_answered(o, req);
    assert!(got.starts_with("HTTP/1.1 200 "), "{got}");
    assert!(got.ends_with("hello /page"), "{got}");
    expect_log_line(
        &log,
        &format!(
            "PROXY 00000 site.invalid 127.0.0.1:{o} 127.0.0.1:{o} GET http://site.invalid/page HTTP/1.1"
        ),
    );
    // Without Host (HTTP/1.0), the destination is the original one too.
    let got = ns.ask_until_answered(o, b"GET /bare HTTP/1.0\r\n\r\n");
    assert!(got.ends_with("hello /bare"), "{got}");
    expect_log_line(
        &log,
        &format!("PROXY 00000 127.0.0.1 127.0.0.1:{o} 127.0.0.1:{o} GET http://127.0.0.1:{o}/bare HTTP/1.0"),
    );
}

/// An HTTP/1.1 request must carry Host (RFC 9112 section 3.2): one from a
/// redirected client without it reaches the origin with a Host naming
/// where the client meant to go, and otherwise as the client sent it.
#[test]
fn transparent_http11_request_without_host_gets_the_destination_as_host() {
    let ns = Redirecting::new("h");
    let origin = crate::http::HttpOrigin::start();
    let port = free_port();
    ns.redirect(origin.port(), port);
    // -a: no forwarding field of the proxy's own.
    let body = format!(
        "{TRANSPARENT}proxy -a -ni{} -i127.0.0.1 -p{port}\n",
        ns.path()
    );
    let (_proxy, log) = start(Dir::new("pl_nohost"), FMT, &body, &[]);
    let o = origin.port();
    // The origin's /head answers with the head it received.
    let got = ns.ask_until_answered(o, b"GET /head HTTP/1.1\r\nAccept: */*\r\n\r\n");
    let (head, received) = got.split_once("\r\n\r\n").unwrap_or((&got, ""));
    assert!(head.starts_with("HTTP/1.1 200 "), "{got}");
    assert_eq!(
        received,
        format!("GET /head HTTP/1.1\r\nHost: 127.0.0.1:{o}\r\nAccept: */*\r\n\r\n")
    );
    expect_log_line(
        &log,
        &format!("PROXY 00000 127.0.0.1 127.0.0.1:{o} 127.0.0.1:{o} GET http://127.0.0.1:{o}/head HTTP/1.1"),
    );
}

#[test]
fn transparent_auto_hands_a_plain_request_to_the_proxy() {
    let ns = Redirecting::new("u");
    let origin = http_origin("127.0.0.1:0");
    let port = free_port();
    ns.redirect(origin.port(), port);
    let body = format!("{TRANSPARENT}auto -ni{} -i127.0.0.1 -p{port}\n", ns.path());
    let (_proxy, log) = start(Dir::new("pl_auto"), FMT, &body, &[]);
    let o = origin.port();
    let req = b"GET /auto HTTP/1.1\r\nHost: auto.invalid\r\nConnection: close\r\n\r\n";
    let got = ns.ask_until_answered(o, req);
    assert!(got.ends_with("hello /auto"), "{got}");
    expect_log_line(
        &log,
        &format!(
            "PROXY 00000 auto.invalid 127.0.0.1:{o} 127.0.0.1:{o} GET http://auto.invalid/auto HTTP/1.1"
        ),
    );
}

#[test]
fn transparent_tlspr_takes_the_sni_as_the_name_of_the_original_destination() {
    let ns = Redirecting::new("s");
    let (origin, seen) = Origin::reply_after_eof(b"server hello", std::time::Duration::ZERO);
    let port = free_port();
    ns.redirect(origin.port(), port);
    let body = format!("{TRANSPARENT}tlspr -ni{} -i127.0.0.1 -p{port}\n", ns.path());
    let (_proxy, log) = start(Dir::new("pl_tlspr"), FMT, &body, &[]);
    let hello = crate::redirect_local::client_hello("name.invalid");
    let got = ns.ask_until_answered(origin.port(), &hello);
    assert_eq!(got, "server hello");
    assert_eq!(
        seen.recv_timeout(IO_TIMEOUT)
            .expect("the origin got the hello"),
        hello
    );
    let o = origin.port();
    expect_log_line(
        &log,
        &format!("TLSPR 00000 name.invalid 127.0.0.1:{o} 127.0.0.1:{o} TLSv1.2 name.invalid -"),
    );
}

#[test]
fn a_plugin_that_is_not_built_is_refused_by_name() {
    let dir = Dir::new("pl_unknown");
    let cfg = dir.cfg_path();
    let f = run_check(&dir, "plugin /usr/lib/3proxy/Mine.ld.so my_plugin\n");
    let msg = f.assert_cfg_error(&cfg, 1, "plugin");
    assert!(
        msg.contains("'my_plugin'") && msg.contains("not built"),
        "{msg}"
    );
    assert!(!msg.contains("unknown command"), "{msg}");
    let f = run_check(
        &dir,
        "auth iponly\nplugin WindowsAuthentication.dll WindowsAuthentication\n",
    );
    let msg = f.assert_cfg_error(&cfg, 2, "plugin");
    assert!(
        msg.contains("WindowsAuthentication") && msg.contains("not built"),
        "{msg}"
    );
    // SSLPlugin and PCREPlugin are built in, whatever FILE says.
    for line in [
        "plugin /x/SSLPlugin.ld.so ssl_plugin",
        "plugin /x/PCREPlugin.ld.so pcre_plugin",
    ] {
        let f = run_check(&dir, &format!("{line}\n"));
        assert_eq!(f.status.code(), Some(0), "{line}: {}", f.stderr);
    }
    // A built-in plugin's file need not exist, as for 3proxy's own
    // built-in ones.
    let f = run_check(
        &dir,
        "plugin /nonexistent/TransparentPlugin.ld.so transparent_plugin\nnotransparent\n\
         plugin /nonexistent/PamAuth.ld.so start login\nauth pam\ntcppm 0 127.0.0.1 1\n",
    );
    assert!(f.status.success(), "{}", f.stderr);
}

/// A system user and a PAM service file for it, removed on drop.
struct PamUser {
    user: String,
    service: String,
}

impl PamUser {
    fn new(password: &str) -> PamUser {
        let id = std::process::id();
        let u = PamUser {
            user: format!("tp3pam{id}"),
            service: format!("threeproxy-test-{id}"),
        };
        let _ = Command::new("userdel").arg(&u.user).output();
        let ok = Command::new("useradd")
            .args(["-M", "-s", "/usr/sbin/nologin", &u.user])
            .status()
            .expect("run useradd");
        assert!(ok.success(), "useradd {} (needs root)", u.user);
        u.set_password(password);
        std::fs::write(
            u.service_file(),
            "auth required pam_unix.so nodelay\naccount required pam_unix.so\n",
        )
        .expect("write the PAM service file (needs root)");
        u
    }

    fn service_file(&self) -> String {
        format!("/etc/pam.d/{}", self.service)
    }

    fn set_password(&self, password: &str) {
        let mut c = Command::new("chpasswd")
            .stdin(Stdio::piped())
            .spawn()
            .expect("run chpasswd");
        writeln!(c.stdin.take().unwrap(), "{}:{password}", self.user).unwrap();
        assert!(c.wait().unwrap().success(), "chpasswd");
    }
}

impl Drop for PamUser {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.service_file());
        let _ = Command::new("userdel").arg(&self.user).output();
    }
}

/// A GET through the proxy at `port` with Basic credentials; the status
/// line that comes back.
fn get_as(port: u16, origin: u16, user: &str, password: &str) -> String {
    let auth = proxy_auth(user, password);
    let request = format!(
        "GET http://127.0.0.1:{origin}/x HTTP/1.1\r\nHost: 127.0.0.1:{origin}\r\n\
         {auth}Connection: close\r\n\r\n"
    );
    http_once(port, request.as_bytes())
        .status_line()
        .to_string()
}

#[test]
fn pamauth_checks_passwords_with_the_system_pam() {
    let pam = PamUser::new("right horse");
    let origin = http_origin("127.0.0.1:0");
    let (pa, pb) = (free_port(), free_port());
    let body = format!(
        "plugin /usr/local/3proxy/libexec/PamAuth.ld.so start {}\n\
         auth pam\nallow *\nproxy -i127.0.0.1 -p{pa}\n\
         authcache user,password 60\nauth cache pam\nproxy -i127.0.0.1 -p{pb}\n",
        pam.service
    );
    let (_proxy, log) = start(Dir::new("pl_pam"), "L%p %E %U", &body, &[pa, pb]);
    let o = origin.port();
    assert_eq!(get_as(pa, o, &pam.user, "right horse"), "HTTP/1.1 200 OK");
    expect_log_line(&log, &format!("{pa} 00000 {}", pam.user));
    let status = get_as(pa, o, &pam.user, "wrong horse");
    assert!(status.starts_with("HTTP/1.1 407"), "{status}");
    expect_log_line(&log, &format!("{pa} 00005 {}", pam.user));
    let status = get_as(pa, o, "nobody-here", "x");
    assert!(status.starts_with("HTTP/1.1 407"), "{status}");
    // Through the cache: a login PAM accepted once is taken from the
    // cache after the password changed, a new one is asked of PAM.
    assert_eq!(get_as(pb, o, &pam.user, "right horse"), "HTTP/1.1 200 OK");
    pam.set_password("new horse");
    assert_eq!(get_as(pb, o, &pam.user, "right horse"), "HTTP/1.1 200 OK");
    assert_eq!(get_as(pb, o, &pam.user, "new horse"), "HTTP/1.1 200 OK");
    let status = get_as(pa, o, &pam.user, "right horse");
    assert!(status.starts_with("HTTP/1.1 407"), "{status}");
}

/// "пароль" in Windows-1251.
const PAROL_1251: &[u8] = b"\xef\xe0\xf0\xee\xeb\xfc";

/// A cfg in Windows-1251: the `users` line (above the `plugin` line, as
/// 3proxy allows) holds ivan's password in that code page.
fn cp1251_cfg(port: u16, plugin: bool, auth: &str) -> Vec<u8> {
    let mut cfg = b"users ivan:CL:".to_vec();
    cfg.extend_from_slice(PAROL_1251);
    cfg.extend_from_slice(b"\n");
    if plugin {
        cfg.extend_from_slice(
            b"plugin /usr/local/3proxy/libexec/utf8tocp1251.ld.so utf8tocp1251\n",
        );
    }
    cfg.extend_from_slice(
        format!("auth {auth}\nallow ivan\nproxy -i127.0.0.1 -p{port}\n").as_bytes(),
    );
    cfg
}

/// Status line of a GET through the proxy with these Basic credentials.
fn get_with_raw_login(port: u16, origin: u16, login: &[u8]) -> String {
    let request = format!(
        "GET http://127.0.0.1:{origin}/x HTTP/1.1\r\nHost: 127.0.0.1:{origin}\r\n\
         Proxy-Authorization: Basic {}\r\nConnection: close\r\n\r\n",
        base64(login)
    );
    http_once(port, request.as_bytes())
        .status_line()
        .to_string()
}

#[test]
fn utf8tocp1251_lets_a_utf8_client_log_in_with_a_windows_1251_password() {
    let origin = http_origin("127.0.0.1:0");
    let o = origin.port();
    let port = free_port();
    let dir = Dir::new("pl_cp1251");
    let cfg = cp1251_cfg(port, true, "utf8tocp1251 strong");
    let _proxy = Proxy::start_bytes(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    // curl sends the password as typed: UTF-8.
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "20",
        ])
        .args(["-x", &format!("http://127.0.0.1:{port}")])
        .args(["-U", "ivan:пароль"])
        .arg(format!("http://127.0.0.1:{o}/x"))
        .output()
        .expect("run curl (tests/deps.sh installs it)");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{out:?}");
    // A client that sends Windows-1251 bytes is let in too, as 3proxy
    // lets it (its recoding leaves bytes that are not UTF-8 alone).
    let mut raw = b"ivan:".to_vec();
    raw.extend_from_slice(PAROL_1251);
    assert_eq!(get_with_raw_login(port, o, &raw), "HTTP/1.1 200 OK");
    // Another password is not.
    let wrong = get_with_raw_login(port, o, "ivan:парол".as_bytes());
    assert!(wrong.contains(" 407 "), "{wrong}");
}

#[test]
fn without_utf8tocp1251_a_windows_1251_cfg_and_its_auth_type_are_refused() {
    let dir = Dir::new("pl_cp1251_no");
    let cfg = dir.cfg_path();
    let f = run_cfg(&dir, &["-t"], cp1251_cfg(free_port(), false, "strong"));
    let msg = f.assert_cfg_error(&cfg, 1, "users");
    assert!(msg.contains("byte 0xef at column 15 is not UTF-8"), "{msg}");
    let f = run_check(&dir, "auth utf8tocp1251 strong\n");
    let msg = f.assert_cfg_error(&cfg, 1, "auth");
    assert!(msg.contains("load it first"), "{msg}");
    // Loaded first, the auth type is known.
    let f = run_check(
        &dir,
        "plugin utf8tocp1251.ld.so utf8tocp1251\nauth utf8tocp1251 strong\n",
    );
    assert_eq!(f.status.code(), Some(0), "{}", f.stderr);
}

#[test]
fn fileplugin_loads_checks_its_commands_and_stores_nothing() {
    let origin = http_origin("127.0.0.1:0");
    let o = origin.port();
    let port = free_port();
    let dir = Dir::new("pl_file");
    let cache = dir.join("cache");
    std::fs::create_dir(&cache).unwrap();
    let cfg = format!(
        "plugin /usr/local/3proxy/libexec/FilePlugin.ld.so file_plugin\n\
         file_cachedir {}\nfile_preview 4096\nauth iponly\nallow *\nproxy -i127.0.0.1 -p{port}\n",
        cache.display()
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let r = http_once(
        port,
        format!("GET http://127.0.0.1:{o}/f HTTP/1.1\r\nHost: 127.0.0.1:{o}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"hello /f");
    // No plugin registers with FilePlugin: nothing is kept.
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0);

    let dir = Dir::new("pl_file_bad");
    let cfg = dir.cfg_path();
    let f = run_check(&dir, "file_cachedir /tmp\n");
    let msg = f.assert_cfg_error(&cfg, 1, "file_cachedir");
    assert!(msg.contains("load it first"), "{msg}");
    let f = run_check(
        &dir,
        "plugin FilePlugin.ld.so file_plugin\nfile_cachedir /tmp/%d\n",
    );
    let msg = f.assert_cfg_error(&cfg, 2, "file_cachedir");
    assert!(msg.contains("no '%'"), "{msg}");
}
