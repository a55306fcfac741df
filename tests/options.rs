//! Service options that tie sockets to a device (`-Di`, `-De`) or a
//! network namespace (`-ni`, `-ne`). These need root and iproute2, which
//! CI has (tests/deps.sh installs iproute2); they fail loudly otherwise.

use std::io::{Read, Write};
use std::process::Command;

use crate::util::*;

#[test]
fn bind_to_device_for_listener_and_destination() {
    let dir = Dir::new("device");
    let log = dir.join("access.log");
    let origin = Origin::echo();
    let (p1, p2) = (free_port(), free_port());
    let cfg = format!(
        "log {}\nlogformat \"L%p %E\"\ntcppm -Dilo -Delo -i127.0.0.1 {p1} 127.0.0.1 {o}\ntcppm -Denosuchdev0 -i127.0.0.1 {p2} 127.0.0.1 {o}\n",
        p(&log),
        o = origin.port()
    );
    let _proxy = Proxy::start(
        dir,
        &cfg,
        &[Listen::Tcp(localhost(p1)), Listen::Tcp(localhost(p2))],
    );
    let mut s = connect(localhost(p1));
    echo_roundtrip(&mut s, b"through lo");
    // A device that does not exist: the outgoing bind fails (code 12).
    let mut s = connect(localhost(p2));
    let mut buf = [0u8; 1];
    assert_eq!(
        s.read(&mut buf).unwrap_or(0),
        0,
        "the session must be closed"
    );
    read_log_line(&log, "code 12 for the missing device", |l| {
        l == format!("{p2} 00012")
    });
}

/// A network namespace made for one test, removed on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("tp-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("run ip(8)");
        assert!(
            ok.success(),
            "ip netns add {name} failed (needs root and iproute2)"
        );
        let up = Command::new("ip")
            .args(["netns", "exec", &name, "ip", "link", "set", "lo", "up"])
            .status()
            .unwrap();
        assert!(up.success());
        Netns(name)
    }

    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.0)
    }

    /// Run a small python client inside the namespace: connect to
    /// 127.0.0.1:port, send `msg`, print what comes back.
    fn ask(&self, port: u16, msg: &str) -> String {
        let code = format!(
            "import socket\ns=socket.create_connection(('127.0.0.1',{port}),timeout=10)\ns.sendall(b'{msg}')\ns.shutdown(socket.SHUT_WR)\nb=b''\nwhile True:\n d=s.recv(4096)\n if not d: break\n b+=d\nprint(b.decode())"
        );
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "python3", "-c", &code])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn listener_in_another_network_namespace() {
    let ns = Netns::new("ni");
    let dir = Dir::new("netns_in");
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "tcppm -ni{} -i127.0.0.1 {port} 127.0.0.1 {}\n",
        ns.path(),
        origin.port()
    );
    let _proxy = Proxy::start(dir, &cfg, &[]);
    // Not reachable from here: the listener lives in the namespace.
    let mut answer = String::new();
    let reached = wait_for(
        || {
            answer = ns.ask(port, "hello ns");
            answer == "hello ns"
        },
        START_TIMEOUT,
    );
    assert!(reached, "no echo from inside the namespace: {answer:?}");
    assert!(
        std::net::TcpStream::connect(localhost(port)).is_err(),
        "the listener must not be in this namespace"
    );
}

#[test]
fn destination_in_another_network_namespace() {
    let ns = Netns::new("ne");
    let dir = Dir::new("netns_out");
    // An origin inside the namespace: a python echo server.
    let oport = free_port();
    let code = format!(
        "import socket\nl=socket.socket()\nl.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\nl.bind(('127.0.0.1',{oport}))\nl.listen()\nprint('up',flush=True)\nwhile True:\n c,_=l.accept()\n c.sendall(b'inside:'+c.recv(100))\n c.close()"
    );
    let mut origin = Command::new("ip")
        .args(["netns", "exec", &ns.0, "python3", "-c", &code])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut up = [0u8; 3];
    origin.stdout.as_mut().unwrap().read_exact(&mut up).unwrap();
    let port = free_port();
    let cfg = format!(
        "tcppm -ne{} -i127.0.0.1 {port} 127.0.0.1 {oport}\n",
        ns.path()
    );
    let _proxy = Proxy::start(dir, &cfg, &[]);
    let mut got = String::new();
    let ok = wait_for(
        || {
            let Ok(mut s) = std::net::TcpStream::connect(localhost(port)) else {
                return false;
            };
            set_timeouts(&s, IO_TIMEOUT);
            let _ = s.write_all(b"x");
            got.clear();
            let _ = s.read_to_string(&mut got);
            got == "inside:x"
        },
        START_TIMEOUT,
    );
    let _ = origin.kill();
    let _ = origin.wait();
    assert!(
        ok,
        "the connection did not reach the namespace's origin: {got:?}"
    );
}
