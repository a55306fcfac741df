//! `radius`, `auth radius` and `log radius` against a real FreeRADIUS
//! (Debian's `freeradius`, which tests/deps.sh installs), run in the
//! foreground on loopback ports with a configuration each test writes in
//! its own dir: accept, reject, failover, no answer, Framed-IP-Address as
//! the source address, `auth cache radius`, Session-Timeout, and
//! accounting (Start/Stop, Interim-Update on `logdump`, across a reload,
//! flushed on SIGTERM) in FreeRADIUS's detail file.

use std::io::{Read, Write};
use std::net::{Shutdown, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::util::*;

const SECRET: &str = "testing123";

/// Users of the `files` module: alice gets a Framed-IP-Address and a
/// Class, bob neither, dave a Session-Timeout of 1 s; erin is rejected
/// with a Reply-Message that starts with a number.
const USERS: &str = r#"alice Cleartext-Password := "secret"
	Framed-IP-Address = 127.0.0.2,
	Class = "gold"
bob Cleartext-Password := "pw2"
dave Cleartext-Password := "pw"
	Session-Timeout = 1
erin Auth-Type := Reject
	Reply-Message = "7 not today"
"#;

/// A FreeRADIUS in the foreground (`-f -l stdout`), answering
/// authentication on `port` and accounting on `port + 1` (3proxy's rule
/// for the accounting port). Killed on drop.
struct Radiusd {
    child: Child,
    port: u16,
    raddb: PathBuf,
    out: Arc<Mutex<Vec<u8>>>,
}

impl Radiusd {
    fn start(dir: &Dir) -> Radiusd {
        let port = port_pair(free_udp_port);
        let raddb = dir.join(&format!("raddb-{port}"));
        for sub in ["log", "run"] {
            std::fs::create_dir_all(raddb.join(sub)).unwrap();
        }
        let d = p(&raddb).to_string();
        std::fs::write(
            raddb.join("dictionary"),
            "$INCLUDE /usr/share/freeradius/dictionary\n",
        )
        .unwrap();
        std::fs::write(raddb.join("users"), USERS).unwrap();
        std::fs::write(raddb.join("acct_users"), "").unwrap();
        // Only what these tests need, from Debian's /etc/freeradius/3.0
        // layout: the files, pap and detail modules, one client (all of
        // loopback), one virtual server. Requests without a correct
        // Message-Authenticator are refused (the client's
        // require_message_authenticator), so every accept proves ours.
        let conf = format!(
            r#"prefix = /usr
exec_prefix = /usr
sysconfdir = /etc
localstatedir = /var
sbindir = /usr/sbin
logdir = {d}/log
raddbdir = {d}
radacctdir = {d}/log
name = freeradius
confdir = {d}
modconfdir = /etc/freeradius/3.0/mods-config
run_dir = {d}/run
db_dir = {d}
libdir = /usr/lib/freeradius
pidfile = {d}/run/radiusd.pid
max_request_time = 30
cleanup_delay = 5
max_requests = 1024
hostname_lookups = no
log {{
	destination = stdout
	colourise = no
	auth = yes
}}
security {{
	allow_core_dumps = no
	max_attributes = 200
	reject_delay = 0
	status_server = no
}}
thread pool {{
	start_servers = 2
	max_servers = 4
	min_spare_servers = 1
	max_spare_servers = 4
	max_requests_per_server = 0
}}
client loopback {{
	ipaddr = 127.0.0.0/8
	secret = {SECRET}
	require_message_authenticator = yes
}}
client loopback6 {{
	ipv6addr = ::1
	secret = {SECRET}
	require_message_authenticator = yes
}}
modules {{
	files {{
		filename = {d}/users
		acctusersfile = {d}/acct_users
	}}
	pap {{
	}}
	detail {{
		filename = {d}/detail
		permissions = 0600
	}}
	detail auth_detail {{
		filename = {d}/auth-detail
		permissions = 0600
	}}
}}
server default {{
	listen {{
		type = auth
		ipaddr = 127.0.0.1
		port = {port}
	}}
	listen {{
		type = acct
		ipaddr = 127.0.0.1
		port = {acct}
	}}
	listen {{
		type = auth
		ipv6addr = ::1
		port = {port}
	}}
	listen {{
		type = acct
		ipv6addr = ::1
		port = {acct}
	}}
	authorize {{
		auth_detail
		files
		pap
	}}
	authenticate {{
		pap
	}}
	preacct {{
	}}
	accounting {{
		detail
	}}
	post-auth {{
	}}
}}
"#,
            acct = port + 1
        );
        std::fs::write(raddb.join("radiusd.conf"), conf).unwrap();
        // Root may run it in the foreground: with no `user`/`group` in
        // `security` it keeps the ids it was started with.
        let mut child = Command::new("freeradius")
            .args(["-f", "-l", "stdout", "-d", &d])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("freeradius (tests/deps.sh installs freeradius)");
        let out = Arc::new(Mutex::new(Vec::new()));
        for pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let sink = out.clone();
            let mut pipe = pipe;
            std::thread::spawn(move || {
                let mut b = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut b) {
                    if n == 0 {
                        break;
                    }
                    sink.lock().unwrap().extend_from_slice(&b[..n]);
                }
            });
        }
        let mut r = Radiusd {
            child,
            port,
            raddb,
            out,
        };
        let ready = wait_for(
            || r.output().contains("Ready to process requests") || r.exited(),
            Duration::from_secs(30),
        );
        let status = r.child.try_wait().ok().flatten();
        assert!(
            ready && status.is_none(),
            "freeradius did not start ({status:?}):\n{}",
            r.output()
        );
        r
    }

    fn exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    fn output(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    fn server(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn detail(&self) -> String {
        std::fs::read_to_string(self.raddb.join("detail")).unwrap_or_default()
    }

    fn auth_detail(&self) -> String {
        std::fs::read_to_string(self.raddb.join("auth-detail")).unwrap_or_default()
    }

    /// The detail file's records (blank-line separated) that contain
    /// every one of `has`, waiting up to `timeout` for `n` of them.
    fn records(&self, has: &[&str], n: usize, timeout: Duration) -> Vec<String> {
        let find = || -> Vec<String> {
            self.detail()
                .split("\n\n")
                .filter(|r| has.iter().all(|h| r.contains(h)))
                .map(str::to_string)
                .collect()
        };
        wait_for(|| find().len() >= n, timeout);
        find()
    }
}

impl Drop for Radiusd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- freeradius output:\n{}", self.output());
            eprintln!("--- detail:\n{}", self.detail());
        }
    }
}

/// A UDP socket nobody reads: a RADIUS server that is down but whose port
/// does not answer with ICMP (the slow failure), and the next port.
fn silent_server() -> (UdpSocket, UdpSocket, String) {
    let p = port_pair(free_udp_port);
    let a = UdpSocket::bind(("127.0.0.1", p)).unwrap();
    let b = UdpSocket::bind(("127.0.0.1", p + 1)).unwrap();
    (a, b, format!("127.0.0.1:{p}"))
}

/// An HTTP origin that answers every request with `body`; records the
/// peer address of each connection.
pub fn http_origin(body: &'static str) -> Origin {
    Origin::start("127.0.0.1:0", move |mut conn| {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match conn.read(&mut b) {
                Ok(1) => head.push(b[0]),
                _ => return,
            }
        }
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    })
}

/// A GET through the proxy with Basic credentials; the whole answer.
fn get(proxy: u16, origin: u16, user: &str, pass: &str) -> Response {
    let auth = proxy_auth(user, pass);
    let request = format!(
        "GET http://127.0.0.1:{origin}/x HTTP/1.1\r\nHost: 127.0.0.1:{origin}\r\n\
         {auth}Connection: close\r\n\r\n"
    );
    http_once(proxy, request.as_bytes())
}

/// A proxy with `auth radius` on the `radius` line `servers`, logging
/// `%U %E` to proxy.log; `extra` goes before the service.
fn start_proxy(dir: Dir, servers: &str, extra: &str) -> (Proxy, u16, PathBuf) {
    let pre = format!("radius {SECRET} {servers}\nauth radius\n{extra}");
    Service::tcp("proxy", "L%U %E %n").start_in(dir, &pre, "", "")
}

#[test]
fn accept_and_reject() {
    let dir = Dir::new("radius_accept");
    let rad = Radiusd::start(&dir);
    let origin = http_origin("hello radius");
    let (_proxy, port, log) = start_proxy(dir, &rad.server(), "");

    let ok = get(port, origin.port(), "bob", "pw2");
    assert_eq!(ok.status, 200, "{ok}");
    assert!(ok.text().ends_with("hello radius"), "{ok}");
    read_log_line(&log, "bob's accept with code 0", |l| {
        l.starts_with("bob 00000")
    });

    let no = get(port, origin.port(), "bob", "wrong");
    assert_eq!(no.status, 407, "{no}");
    assert!(no.head.contains("Proxy-Authenticate: Basic"), "{no}");
    read_log_line(&log, "bob's reject with code 25", |l| {
        l.starts_with("bob 00025")
    });
    let unknown = get(port, origin.port(), "carol", "x");
    assert_eq!(unknown.status, 407, "{unknown}");
    // As in 3proxy, a Reply-Message's number is the result code.
    let erin = get(port, origin.port(), "erin", "x");
    assert_eq!(erin.status, 407, "{erin}");
    read_log_line(&log, "erin's reject with code 7", |l| {
        l.starts_with("erin 00007")
    });
    assert_eq!(
        origin.peers().len(),
        1,
        "refused requests reached the origin"
    );

    // What the Access-Request carried, as FreeRADIUS read it.
    let sent = rad.auth_detail();
    for want in [
        "User-Name = \"bob\"",
        "Service-Type = Authenticate-Only",
        "NAS-Port-Type = Virtual",
        &format!("NAS-Port = {port}"),
        "NAS-IP-Address = 127.0.0.1",
        "NAS-Identifier = \"PROXY\"",
        "Calling-Station-Id = \"127.0.0.1\"",
        "Framed-IP-Address = 127.0.0.1",
        "Called-Station-Id = \"127.0.0.1\"",
        &format!("Login-TCP-Port = {}", origin.port()),
        "Login-IP-Host = 127.0.0.1",
        "Message-Authenticator = ",
        "Acct-Session-Id = ",
    ] {
        assert!(sent.contains(want), "no {want:?} in:\n{sent}");
    }
}

#[test]
fn the_second_server_answers_when_the_first_is_down() {
    let dir = Dir::new("radius_failover");
    let rad = Radiusd::start(&dir);
    let (_a, _b, down) = silent_server();
    let origin = http_origin("second");
    // Each server is waited for `timeouts` slot 1 (1 s here).
    let (_proxy, port, log) = start_proxy(
        dir,
        &format!("{down} {}", rad.server()),
        "timeouts 1 1 5 30 60 180 1800 15 60",
    );
    let t = Instant::now();
    let ok = get(port, origin.port(), "bob", "pw2");
    assert_eq!(ok.status, 200, "{ok}");
    assert!(ok.text().ends_with("second"), "{ok}");
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    read_log_line(&log, "code 0", |l| l.starts_with("bob 00000"));
    // The server that failed is asked last for a while: the next request
    // does not wait for it.
    let t = Instant::now();
    let ok = get(port, origin.port(), "bob", "pw2");
    assert_eq!(ok.status, 200, "{ok}");
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn no_server_answering_is_a_refusal_within_the_timeout() {
    let dir = Dir::new("radius_none");
    let (_a, _b, down1) = silent_server();
    let (_c, _d, down2) = silent_server();
    let origin = http_origin("never");
    let (_proxy, port, log) = start_proxy(
        dir,
        &format!("{down1} {down2}"),
        "timeouts 1 1 5 30 60 180 1800 15 60",
    );
    let t = Instant::now();
    let no = get(port, origin.port(), "bob", "pw2");
    let took = t.elapsed();
    assert_eq!(no.status, 407, "{no}");
    // Two servers, 1 s each.
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    read_log_line(&log, "code 26", |l| l.starts_with("bob 00026"));
    assert!(origin.peers().is_empty());

    // SOCKS 5 gets a refusal too, not a hang.
    let sport = free_port();
    let dir = Dir::new("radius_none_socks");
    let cfg = format!(
        "radius {SECRET} {down1}\ntimeouts 1 1 5 30 60 180 1800 15 60\nauth radius\n\
         socks -p{sport} -i127.0.0.1\n"
    );
    let _socks = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(sport))]);
    let mut s = connect(localhost(sport));
    s.write_all(&[5, 1, 2]).unwrap();
    expect_bytes(&mut s, &[5, 2]);
    s.write_all(&socks5_credentials("bob", "pw2")).unwrap();
    let mut b = [0u8; 2];
    s.read_exact(&mut b).unwrap();
    s.write_all(&socks5_request(1, localhost(origin.port())))
        .unwrap();
    let rep = read_socks5_reply(&mut s).unwrap();
    assert_eq!(rep[0], 5);
    // Code 26 is 0x01, general failure, as for every code from 20 to 29.
    assert_eq!(rep[1], 1, "SOCKS reply {rep:?}");
}

#[test]
fn framed_ip_address_is_the_source_address() {
    let dir = Dir::new("radius_framed");
    let rad = Radiusd::start(&dir);
    let origin = http_origin("from 127.0.0.2");
    let (_proxy, port, _log) = start_proxy(dir, &rad.server(), "");
    let ok = get(port, origin.port(), "alice", "secret");
    assert_eq!(ok.status, 200, "{ok}");
    let peers = origin.peers();
    assert_eq!(peers.len(), 1);
    assert_eq!(peers[0].ip().to_string(), "127.0.0.2", "{peers:?}");
    // bob has none: the default source.
    let ok = get(port, origin.port(), "bob", "pw2");
    assert_eq!(ok.status, 200, "{ok}");
    assert_eq!(origin.peers()[1].ip().to_string(), "127.0.0.1");
}

/// The value of `name = value` in a detail record.
fn attr<'a>(rec: &'a str, name: &str) -> Option<&'a str> {
    rec.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(" = "))
}

#[test]
fn start_and_stop_with_octets_in_the_detail_file() {
    let dir = Dir::new("radius_acct");
    let rad = Radiusd::start(&dir);
    // Reads 1000 bytes to EOF, then sends 3000.
    let reply: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
    let (origin, got) = Origin::reply_after_eof(&reply, Duration::ZERO);
    let port = free_port();
    let cfg = format!(
        "radius {SECRET} {}\nlog radius\nauth radius\nsocks -p{port} -i127.0.0.1\n",
        rad.server()
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut s = socks5_connect(port, Some(("alice", "secret")), localhost(origin.port()));
    s.write_all(&[7u8; 1000]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let back = read_until_closed(&mut s).unwrap();
    assert_eq!(back, reply);
    assert_eq!(got.recv_timeout(IO_TIMEOUT).unwrap().len(), 1000);

    // The harness's readiness probe is a session too (a Stop without a
    // user): only alice's records count.
    let alice = "User-Name = \"alice\"";
    let start = rad.records(&["Acct-Status-Type = Start", alice], 1, LOG_TIMEOUT);
    let stop = rad.records(&["Acct-Status-Type = Stop", alice], 1, LOG_TIMEOUT);
    assert_eq!((start.len(), stop.len()), (1, 1), "{}", rad.detail());
    let (start, stop) = (&start[0], &stop[0]);
    for r in [start, stop] {
        assert_eq!(attr(r, "User-Name"), Some("\"alice\""), "{r}");
        assert_eq!(attr(r, "NAS-Identifier"), Some("\"SOCK5\""), "{r}");
        assert_eq!(attr(r, "Calling-Station-Id"), Some("\"127.0.0.1\""), "{r}");
        // The Class of alice's Access-Accept ("gold"), echoed.
        assert_eq!(attr(r, "Class"), Some("0x676f6c64"), "{r}");
    }
    assert_eq!(
        attr(start, "Acct-Session-Id"),
        attr(stop, "Acct-Session-Id"),
        "{start}\n{stop}"
    );
    // The Access-Request's Acct-Session-Id, as 3proxy uses one for both.
    let asked = rad.auth_detail();
    assert_eq!(
        attr(&asked, "Acct-Session-Id"),
        attr(start, "Acct-Session-Id"),
        "{asked}"
    );
    // Input: what the client received (3proxy's %I); output: what it sent.
    assert_eq!(attr(stop, "Acct-Input-Octets"), Some("3000"), "{stop}");
    assert_eq!(attr(stop, "Acct-Output-Octets"), Some("1000"), "{stop}");
    assert_eq!(
        attr(stop, "Acct-Terminate-Cause"),
        Some("User-Request"),
        "{stop}"
    );
    assert!(attr(stop, "Acct-Session-Time").is_some(), "{stop}");
    assert!(attr(start, "Acct-Input-Octets").is_none(), "{start}");
}

/// TrafficPlugin corrects before 3proxy's `log radius` sends the Stop:
/// the Stop says the corrected octets.
#[test]
fn trafcorrect_corrects_the_octets_of_the_stop() {
    let dir = Dir::new("radius_trafcorrect");
    let rad = Radiusd::start(&dir);
    let reply = [5u8; 3000];
    let (origin, got) = Origin::reply_after_eof(&reply, Duration::ZERO);
    let port = free_port();
    let cfg = format!(
        "radius {SECRET} {}\nlog radius\nauth radius\n\
         plugin TrafficPlugin.ld.so start\ntrafcorrect m socks5 {} 2\n\
         socks -p{port} -i127.0.0.1\n",
        rad.server(),
        origin.port()
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut s = socks5_connect(port, Some(("alice", "secret")), localhost(origin.port()));
    s.write_all(&[7u8; 1000]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_until_closed(&mut s).unwrap().len(), 3000);
    assert_eq!(got.recv_timeout(IO_TIMEOUT).unwrap().len(), 1000);
    let alice = "User-Name = \"alice\"";
    let stop = rad.records(&["Acct-Status-Type = Stop", alice], 1, LOG_TIMEOUT);
    assert_eq!(stop.len(), 1, "{}", rad.detail());
    assert_eq!(
        attr(&stop[0], "Acct-Input-Octets"),
        Some("6000"),
        "{}",
        stop[0]
    );
    assert_eq!(
        attr(&stop[0], "Acct-Output-Octets"),
        Some("2000"),
        "{}",
        stop[0]
    );
}

#[test]
fn sigterm_sends_the_pending_stops_first() {
    let dir = Dir::new("radius_sigterm");
    let rad = Radiusd::start(&dir);
    // The first server never answers: each accounting request waits 1 s
    // for it before FreeRADIUS gets it, so the Stop is still queued when
    // the signal comes.
    let (_a, _b, down) = silent_server();
    let (origin, _got) = Origin::reply_after_eof(b"bye", Duration::ZERO);
    let port = free_port();
    // Accounting works whatever the auth type: here `strong`.
    let cfg = format!(
        "radius {SECRET} {down} {}\ntimeouts 1 1 5 30 60 180 1800 15 60\nlog radius\n\
         users bob:CL:pw2\nauth strong\nsocks -p{port} -i127.0.0.1\n",
        rad.server()
    );
    let mut proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut s = socks5_connect(port, Some(("bob", "pw2")), localhost(origin.port()));
    s.write_all(b"hi").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_until_closed(&mut s).unwrap(), b"bye");
    drop(s);
    proxy.signal("TERM");
    assert!(proxy.wait_exit(Duration::from_secs(15)).is_some());
    let stop = rad.records(&["Acct-Status-Type = Stop", "\"bob\""], 1, Duration::ZERO);
    assert_eq!(stop.len(), 1, "no Stop before exit:\n{}", rad.detail());
    assert_eq!(
        attr(&stop[0], "Acct-Input-Octets"),
        Some("3"),
        "{}",
        stop[0]
    );
    assert_eq!(
        attr(&stop[0], "Acct-Output-Octets"),
        Some("2"),
        "{}",
        stop[0]
    );
}

#[test]
fn authcache_keeps_radius_answers_and_their_source_address() {
    let dir = Dir::new("radius_cache");
    let rad = Radiusd::start(&dir);
    let origin = http_origin("cached");
    let (_proxy, port, log) = start_proxy(
        dir,
        &rad.server(),
        "timeouts 1 1 5 30 60 180 1800 15 60\nauthcache user,pass,ext 60\nauth cache radius",
    );
    let ok = get(port, origin.port(), "alice", "secret");
    assert_eq!(ok.status, 200, "{ok}");
    drop(rad);
    // FreeRADIUS is gone: the cache answers, with alice's address.
    let ok = get(port, origin.port(), "alice", "secret");
    assert_eq!(ok.status, 200, "{ok}");
    let peers = origin.peers();
    assert_eq!(peers.len(), 2);
    assert!(
        peers.iter().all(|p| p.ip().to_string() == "127.0.0.2"),
        "{peers:?}"
    );
    // Another password is not in the cache, and no server answers.
    let no = get(port, origin.port(), "alice", "other");
    assert_eq!(no.status, 407, "{no}");
    read_log_line(&log, "code 26", |l| l.starts_with("alice 00026"));
}

#[test]
fn session_timeout_ends_the_session() {
    let dir = Dir::new("radius_session_timeout");
    let rad = Radiusd::start(&dir);
    let origin = Origin::echo();
    let port = free_port();
    let log = dir.join("proxy.log");
    let cfg = format!(
        "log {}\nlogformat \"L%U %E\"\nradius {SECRET} {}\nauth radius\nsocks -p{port} -i127.0.0.1\n",
        p(&log),
        rad.server()
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let t = Instant::now();
    let mut s = socks5_connect(port, Some(("dave", "pw")), localhost(origin.port()));
    echo_roundtrip(&mut s, b"still here");
    // The tunnel is idle and the idle timeout is long: only the
    // Session-Timeout (1 s) ends it.
    let rest = read_until_closed(&mut s).unwrap();
    assert!(rest.is_empty());
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    read_log_line(&log, "code 27", |l| l == "dave 00027");
    // bob has no Session-Timeout: his tunnel outlives dave's.
    let mut s = socks5_connect(port, Some(("bob", "pw2")), localhost(origin.port()));
    std::thread::sleep(Duration::from_millis(1500));
    echo_roundtrip(&mut s, b"bob too");
}

#[test]
fn logdump_records_are_interim_updates() {
    let dir = Dir::new("radius_interim");
    let rad = Radiusd::start(&dir);
    let reply: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
    let (origin, _got) = Origin::reply_after_eof(&reply, Duration::ZERO);
    let port = free_port();
    let cfg = format!(
        "radius {SECRET} {}\nlog radius\nlogdump 1000\nauth radius\nsocks -p{port} -i127.0.0.1\n",
        rad.server()
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut s = socks5_connect(port, Some(("bob", "pw2")), localhost(origin.port()));
    s.write_all(&[1u8; 1000]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_until_closed(&mut s).unwrap(), reply);
    let bob = "User-Name = \"bob\"";
    let stop = rad.records(&["Acct-Status-Type = Stop", bob], 1, LOG_TIMEOUT);
    let interim = rad.records(&["Acct-Status-Type = Interim-Update", bob], 1, LOG_TIMEOUT);
    assert_eq!(stop.len(), 1, "{}", rad.detail());
    assert!(!interim.is_empty(), "no Interim-Update:\n{}", rad.detail());
    let id = attr(&stop[0], "Acct-Session-Id");
    let mut last = 0;
    for r in &interim {
        assert_eq!(attr(r, "Acct-Session-Id"), id, "{r}");
        let n: u64 = attr(r, "Acct-Input-Octets").unwrap().parse().unwrap();
        assert!(n >= 1000 && n >= last && n <= 3000, "{r}");
        last = n;
    }
    // The Stop counts the whole session, not what came after the last
    // Interim-Update.
    assert_eq!(
        attr(&stop[0], "Acct-Input-Octets"),
        Some("3000"),
        "{}",
        stop[0]
    );
    assert_eq!(
        attr(&stop[0], "Acct-Output-Octets"),
        Some("1000"),
        "{}",
        stop[0]
    );
}

#[test]
fn a_reload_keeps_the_session_and_its_accounting() {
    let dir = Dir::new("radius_reload");
    let rad = Radiusd::start(&dir);
    let origin = Origin::echo();
    let (port, port2) = (free_port(), free_port());
    let cfg = format!(
        "radius {SECRET} {}\nlog radius\nauth radius\nsocks -p{port} -i127.0.0.1\n",
        rad.server()
    );
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut s = socks5_connect(port, Some(("alice", "secret")), localhost(origin.port()));
    echo_roundtrip(&mut s, b"abc");
    // A new service shows when the reload has taken effect.
    proxy
        .dir
        .write("3proxy.cfg", format!("{cfg}socks -p{port2} -i127.0.0.1\n"));
    proxy.signal("USR1");
    assert!(wait_for(
        || std::net::TcpStream::connect(localhost(port2)).is_ok(),
        START_TIMEOUT
    ));
    // `force`: the session is asked about again, and goes on.
    echo_roundtrip(&mut s, b"defg");
    let asked = || rad.auth_detail().matches("User-Name = \"alice\"").count();
    assert!(
        wait_for(|| asked() >= 2, LOG_TIMEOUT),
        "{}",
        rad.auth_detail()
    );
    drop(s);
    let alice = "User-Name = \"alice\"";
    let start = rad.records(&["Acct-Status-Type = Start", alice], 1, LOG_TIMEOUT);
    let stop = rad.records(&["Acct-Status-Type = Stop", alice], 1, LOG_TIMEOUT);
    assert_eq!((start.len(), stop.len()), (1, 1), "{}", rad.detail());
    assert_eq!(
        attr(&start[0], "Acct-Session-Id"),
        attr(&stop[0], "Acct-Session-Id")
    );
    assert_eq!(
        attr(&stop[0], "Acct-Input-Octets"),
        Some("7"),
        "{}",
        stop[0]
    );
    assert_eq!(
        attr(&stop[0], "Acct-Output-Octets"),
        Some("7"),
        "{}",
        stop[0]
    );
}

#[test]
fn the_cfgs_of_3proxys_documentation_load() {
    // doc/html/highload.html's RADIUS examples, and the man page's form
    // with ports and local addresses; `log radius` as 3proxy writes it.
    for cfg in [
        "radius secret 1.2.3.4\nauth radius\nproxy -p0\n",
        "radius secret 1.2.3.4\nauthcache ip,user,pass 600\nauth cache radius\nproxy -p0\n",
        "radius secret 10.0.0.1:1645/127.0.0.1 [::1]:1812\nlog radius\nauth strong radius\n\
         socks -p0\n",
    ] {
        let dir = Dir::new("radius_doc_cfg");
        let out = run_check(&dir, cfg);
        assert!(out.status.success(), "{cfg}\n{}", out.stderr);
    }
    let dir = Dir::new("radius_bad_cfg");
    run_check(&dir, "radius secret 10.0.0.1:65535\n").assert_cfg_error(
        &dir.cfg_path(),
        1,
        "radius",
    );
}

#[test]
fn each_http_request_is_a_start_and_a_stop() {
    let dir = Dir::new("radius_http_acct");
    let rad = Radiusd::start(&dir);
    let origin = Origin::start("127.0.0.1:0", |mut conn| {
        // Two requests on one connection, each answered with 5 bytes.
        for _ in 0..2 {
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match conn.read(&mut b) {
                    Ok(1) => head.push(b[0]),
                    _ => return,
                }
            }
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        }
    });
    let port = free_port();
    let cfg = format!(
        "radius {SECRET} {}\nlog radius\nauth radius\nproxy -p{port} -i127.0.0.1\n",
        rad.server()
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut s = connect(localhost(port));
    let cred = base64("bob:pw2");
    let o = origin.port();
    let req = format!(
        "GET http://127.0.0.1:{o}/a HTTP/1.1\r\nHost: 127.0.0.1:{o}\r\n\
         Proxy-Authorization: Basic {cred}\r\n\r\n"
    );
    let mut got = Vec::new();
    for n in 1..=2 {
        s.write_all(req.as_bytes()).unwrap();
        let mut b = [0u8; 1024];
        while String::from_utf8_lossy(&got).matches("hello").count() < n {
            let k = s.read(&mut b).unwrap();
            assert!(k > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&b[..k]);
        }
    }
    drop(s);
    let bob = "User-Name = \"bob\"";
    let starts = rad.records(&["Acct-Status-Type = Start", bob], 2, LOG_TIMEOUT);
    let stops = rad.records(&["Acct-Status-Type = Stop", bob], 2, LOG_TIMEOUT);
    assert_eq!((starts.len(), stops.len()), (2, 2), "{}", rad.detail());
    let id = |r: &String| attr(r, "Acct-Session-Id").map(str::to_string);
    assert_ne!(id(&starts[0]), id(&starts[1]));
    // Each session's Stop follows its Start; the two sessions' requests
    // are not ordered against each other (the sender has several in
    // flight), so a Stop is found by its session's id.
    for start in &starts {
        let stop = stops
            .iter()
            .find(|s| id(s) == id(start))
            .unwrap_or_else(|| panic!("no Stop for {start}\n{}", rad.detail()));
        assert_eq!(attr(stop, "NAS-Identifier"), Some("\"PROXY\""), "{stop}");
        assert_eq!(
            attr(stop, "Called-Station-Id"),
            Some("\"127.0.0.1\""),
            "{stop}"
        );
        let sent: u64 = attr(stop, "Acct-Input-Octets").unwrap().parse().unwrap();
        // At least the answer's body went to the client.
        assert!(sent >= 5, "{stop}");
    }
}

/// Two requests on one kept-alive connection, to two origins (other
/// addresses, other ports): each Start names its own request's
/// destination, not the one before it (the Start used to go out before
/// the request's address was set).
#[test]
fn each_start_names_its_own_requests_destination() {
    let dir = Dir::new("radius_http_dest");
    let rad = Radiusd::start(&dir);
    let answer = |mut conn: std::net::TcpStream| {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match conn.read(&mut b) {
                Ok(1) => head.push(b[0]),
                _ => return,
            }
        }
        let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        // Keep the connection until the proxy closes it.
        let _ = conn.read(&mut b);
    };
    let one = Origin::start("127.0.0.1:0", answer);
    let two = Origin::start("127.0.0.2:0", answer);
    let port = free_port();
    let cfg = format!(
        "radius {SECRET} {}\nlog radius\nauth radius\nproxy -p{port} -i127.0.0.1\n",
        rad.server()
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut s = connect(localhost(port));
    let cred = base64("bob:pw2");
    let mut got = Vec::new();
    for (n, (ip, o)) in [("127.0.0.1", one.port()), ("127.0.0.2", two.port())]
        .into_iter()
        .enumerate()
    {
        let req = format!(
            "GET http://{ip}:{o}/a HTTP/1.1\r\nHost: {ip}:{o}\r\n\
             Proxy-Authorization: Basic {cred}\r\n\r\n"
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut b = [0u8; 1024];
        while String::from_utf8_lossy(&got).matches("hello").count() < n + 1 {
            let k = s.read(&mut b).unwrap();
            assert!(k > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&b[..k]);
        }
    }
    drop(s);
    let bob = "User-Name = \"bob\"";
    let starts = rad.records(&["Acct-Status-Type = Start", bob], 2, LOG_TIMEOUT);
    let stops = rad.records(&["Acct-Status-Type = Stop", bob], 2, LOG_TIMEOUT);
    assert_eq!((starts.len(), stops.len()), (2, 2), "{}", rad.detail());
    let id = |r: &String| attr(r, "Acct-Session-Id").map(str::to_string);
    for (i, (ip, o)) in [("127.0.0.1", one.port()), ("127.0.0.2", two.port())]
        .into_iter()
        .enumerate()
    {
        // The detail file keeps the order FreeRADIUS got them in; find
        // each request's pair by the Stop's destination.
        let stop = stops
            .iter()
            .find(|r| attr(r, "Login-TCP-Port") == Some(&o.to_string()))
            .unwrap_or_else(|| panic!("no Stop for request {i} to {ip}:{o}:\n{}", rad.detail()));
        let start = starts
            .iter()
            .find(|r| id(r) == id(stop))
            .unwrap_or_else(|| panic!("no Start for {stop}"));
        for r in [start, stop] {
            assert_eq!(attr(r, "Login-IP-Host"), Some(ip), "{r}");
            assert_eq!(
                attr(r, "Login-TCP-Port"),
                Some(o.to_string().as_str()),
                "{r}"
            );
            assert_eq!(
                attr(r, "Called-Station-Id"),
                Some(format!("\"{ip}\"").as_str()),
                "{r}"
            );
        }
    }
}

#[test]
fn an_ipv6_server() {
    let dir = Dir::new("radius_v6");
    let rad = Radiusd::start(&dir);
    let origin = http_origin("over v6");
    let server = format!("[::1]:{}", rad.port);
    // The last `log` line wins: accounting, to the same server.
    let (_proxy, port, _) = start_proxy(dir, &server, "log radius");
    let ok = get(port, origin.port(), "bob", "pw2");
    assert_eq!(ok.status, 200, "{ok}");
    assert!(ok.text().ends_with("over v6"), "{ok}");
    let stop = rad.records(&["Acct-Status-Type = Stop", "\"bob\""], 1, LOG_TIMEOUT);
    assert_eq!(stop.len(), 1, "{}", rad.detail());
}

/// A CONNECT tunnel through the HTTP proxy on `proxy` to `to`, as `user`,
/// and the length of the proxy's answer (counted in the session's input).
fn connect_tunnel(proxy: u16, to: u16, user: &str, pass: &str) -> (std::net::TcpStream, u64) {
    let (s, head) = http_connect(proxy, to, &proxy_auth(user, pass));
    assert_eq!(head.split(' ').nth(1), Some("200"), "{head}");
    (s, head.len() as u64)
}

/// Echo `n` bytes through `s` and read them back.
fn echo_n(s: &mut std::net::TcpStream, n: usize) {
    let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    s.write_all(&data).unwrap();
    let mut back = vec![0u8; n];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, data);
}

fn octets(r: &str, name: &str) -> u64 {
    attr(r, name)
        .unwrap_or_else(|| panic!("no {name}: {r}"))
        .parse()
        .unwrap()
}

#[test]
fn radiusinterim_sends_growing_interim_updates_then_the_stop() {
    let dir = Dir::new("radius_periodic");
    let rad = Radiusd::start(&dir);
    let origin = Origin::echo();
    let port = free_port();
    let cfg = format!(
        "radius {SECRET} {}\nradiusinterim 1\nlog radius\nauth radius\n\
         proxy -p{port} -i127.0.0.1\n",
        rad.server()
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let (mut s, head) = connect_tunnel(port, origin.port(), "alice", "secret");
    let alice = "User-Name = \"alice\"";
    let interim = |min: u64| {
        let ok = |r: &String| {
            attr(r, "Acct-Input-Octets").and_then(|v| v.parse::<u64>().ok()) >= Some(min + head)
        };
        wait_for(
            || {
                rad.records(&["Interim-Update", alice], 0, Duration::ZERO)
                    .iter()
                    .any(ok)
            },
            LOG_TIMEOUT,
        );
        rad.records(&["Interim-Update", alice], 0, Duration::ZERO)
    };
    echo_n(&mut s, 1000);
    let first = interim(1000);
    // Input: what the client got, the proxy's answer too.
    assert!(
        first
            .iter()
            .any(|r| octets(r, "Acct-Input-Octets") == 1000 + head),
        "no Interim-Update with 1000 bytes:\n{}",
        rad.detail()
    );
    echo_n(&mut s, 2000);
    let all = interim(3000);
    // Counts only grow, and the tunnel's bytes are all there.
    let mut last = 0;
    for r in &all {
        let n = octets(r, "Acct-Input-Octets");
        assert!(n >= last && n <= 3000 + head, "{r}");
        let out = octets(r, "Acct-Output-Octets");
        assert!(out + head == n || (n, out) == (0, 0), "{r}");
        assert!(attr(r, "Acct-Session-Time").is_some(), "{r}");
        assert_eq!(attr(r, "Class"), Some("0x676f6c64"), "{r}");
        last = n;
    }
    assert_eq!(last, 3000 + head, "{}", rad.detail());
    // The timer keeps sending while the session lives: at least two
    // with the same count, one a second.
    let n = all.len();
    assert!(
        wait_for(
            || rad
                .records(&["Interim-Update", alice], 0, Duration::ZERO)
                .len()
                > n,
            LOG_TIMEOUT
        ),
        "{}",
        rad.detail()
    );
    drop(s);
    let stop = rad.records(&["Acct-Status-Type = Stop", alice], 1, LOG_TIMEOUT);
    assert_eq!(stop.len(), 1, "{}", rad.detail());
    let stop = &stop[0];
    assert_eq!(octets(stop, "Acct-Input-Octets"), 3000 + head, "{stop}");
    assert_eq!(octets(stop, "Acct-Output-Octets"), 3000, "{stop}");
    let id = attr(stop, "Acct-Session-Id");
    for r in rad.records(&["Interim-Update", alice], 0, Duration::ZERO) {
        assert_eq!(attr(&r, "Acct-Session-Id"), id, "{r}");
    }
    // No Interim-Update after the Stop (the timer ticks four times a
    // second; this waits out more than one interval).
    std::thread::sleep(Duration::from_millis(1500));
    let detail = rad.detail();
    let tail = &detail[detail.find(stop.as_str()).unwrap()..];
    assert!(!tail.contains("Interim-Update"), "{detail}");
}

/// `radclient` sending one `kind` request (`disconnect`, `coa`) with
/// `attrs` to 127.0.0.1:`port` under `secret`, one try, 1 s: its output.
fn radclient(port: u16, kind: &str, secret: &str, attrs: &str) -> String {
    let mut c = Command::new("radclient")
        .args(["-x", "-r", "1", "-t", "1"])
        .arg(format!("127.0.0.1:{port}"))
        .args([kind, secret])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("radclient (tests/deps.sh installs freeradius-utils)");
    c.stdin.take().unwrap().write_all(attrs.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn radiusdae_disconnect_request_ends_the_tunnel() {
    let dir = Dir::new("radius_dae");
    let rad = Radiusd::start(&dir);
    let origin = Origin::echo();
    let (port, dae, port2) = (free_port(), free_udp_port(), free_port());
    let cfg = format!(
        "radius {SECRET} {}\nradiusdae {dae} daesecret 127.0.0.0/8\nlog radius\nauth radius\n\
         proxy -p{port} -i127.0.0.1\n",
        rad.server()
    );
    let proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let (mut a, head) = connect_tunnel(port, origin.port(), "alice", "secret");
    let (mut b, _) = connect_tunnel(port, origin.port(), "bob", "pw2");
    echo_n(&mut a, 10);
    echo_n(&mut b, 20);

    // Nobody of that name: NAK, Session-Context-Not-Found.
    let out = radclient(dae, "disconnect", "daesecret", "User-Name = \"nobody\"\n");
    assert!(out.contains("Received Disconnect-NAK"), "{out}");
    assert!(out.contains("Session-Context-Not-Found"), "{out}");
    // Another secret: no answer at all, and the tunnel goes on.
    let out = radclient(dae, "disconnect", "wrong", "User-Name = \"alice\"\n");
    assert!(!out.contains("Received"), "{out}");
    assert!(out.contains("No reply"), "{out}");
    echo_n(&mut a, 10);
    // CoA cannot change a live session: CoA-NAK, Unsupported-Extension.
    let out = radclient(dae, "coa", "daesecret", "User-Name = \"alice\"\n");
    assert!(out.contains("Received CoA-NAK"), "{out}");
    assert!(out.contains("Unsupported-Extension"), "{out}");
    echo_n(&mut a, 10);

    // By Acct-Session-Id (the one its Start carried), with a
    // Message-Authenticator: alice's tunnel ends, bob's does not.
    let alice = "User-Name = \"alice\"";
    let start = rad.records(&["Acct-Status-Type = Start", alice], 1, LOG_TIMEOUT);
    let sid = attr(&start[0], "Acct-Session-Id").unwrap().to_string();
    let out = radclient(
        dae,
        "disconnect",
        "daesecret",
        &format!("Acct-Session-Id = {sid}\nMessage-Authenticator = 0x00\n"),
    );
    assert!(out.contains("Received Disconnect-ACK"), "{out}");
    set_timeouts(&a, IO_TIMEOUT);
    assert!(read_until_closed(&mut a).unwrap().is_empty());
    echo_n(&mut b, 20);
    let stop = rad.records(&["Acct-Status-Type = Stop", alice], 1, LOG_TIMEOUT);
    assert_eq!(stop.len(), 1, "{}", rad.detail());
    // Result code 80 (ended from outside) is Admin-Reset.
    assert_eq!(
        attr(&stop[0], "Acct-Terminate-Cause"),
        Some("Admin-Reset"),
        "{}",
        stop[0]
    );
    assert_eq!(
        octets(&stop[0], "Acct-Input-Octets"),
        30 + head,
        "{}",
        stop[0]
    );

    // A reload that allows another source only: the same request is
    // not answered any more (the socket stays, its settings change).
    proxy.dir.write(
        "3proxy.cfg",
        format!(
            "{}proxy -p{port2} -i127.0.0.1\n",
            cfg.replace("127.0.0.0/8", "192.0.2.1")
        ),
    );
    proxy.signal("USR1");
    assert!(wait_for(
        || std::net::TcpStream::connect(localhost(port2)).is_ok(),
        START_TIMEOUT
    ));
    let out = radclient(dae, "disconnect", "daesecret", "User-Name = \"bob\"\n");
    assert!(out.contains("No reply"), "{out}");
    echo_n(&mut b, 20);
    // Allowed again: bob's tunnel ends by his User-Name.
    proxy.dir.write("3proxy.cfg", &cfg);
    proxy.signal("USR1");
    assert!(wait_for(
        || std::net::TcpStream::connect(localhost(port2)).is_err(),
        START_TIMEOUT
    ));
    let out = radclient(dae, "disconnect", "daesecret", "User-Name = \"bob\"\n");
    assert!(out.contains("Received Disconnect-ACK"), "{out}");
    set_timeouts(&b, IO_TIMEOUT);
    assert!(read_until_closed(&mut b).unwrap().is_empty());
    let bob = "User-Name = \"bob\"";
    let stop = rad.records(&["Acct-Status-Type = Stop", bob], 1, LOG_TIMEOUT);
    assert_eq!(
        attr(&stop[0], "Acct-Terminate-Cause"),
        Some("Admin-Reset"),
        "{}",
        stop[0]
    );
    // Nothing left of bob's.
    let out = radclient(dae, "disconnect", "daesecret", "User-Name = \"bob\"\n");
    assert!(out.contains("Received Disconnect-NAK"), "{out}");
}

#[test]
fn radiusdae_file_log_says_code_80() {
    let dir = Dir::new("radius_dae_log");
    let origin = Origin::echo();
    let (port, dae) = (free_port(), free_udp_port());
    let log = dir.join("proxy.log");
    // No RADIUS server at all: `radiusdae` works with any auth and log.
    let cfg = format!(
        "log {}\nlogformat \"L%U %E\"\nusers carol:CL:pw\nauth strong\n\
         radiusdae 127.0.0.1:{dae} s3cret\nproxy -p{port} -i127.0.0.1\n",
        p(&log)
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let (mut s, _) = connect_tunnel(port, origin.port(), "carol", "pw");
    echo_n(&mut s, 5);
    let out = radclient(dae, "disconnect", "s3cret", "User-Name = \"carol\"\n");
    assert!(out.contains("Received Disconnect-ACK"), "{out}");
    set_timeouts(&s, IO_TIMEOUT);
    assert!(read_until_closed(&mut s).unwrap().is_empty());
    read_log_line(&log, "code 80", |l| l == "carol 00080");
}
