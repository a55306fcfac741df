//! Parking (`parklinger`, issue 19): a relay that goes quiet leaves its
//! thread and waits in the parking lot; when either side sends, it goes
//! on on a thread, where it stopped. Thousands of idle tunnels through
//! tcppm, SOCKS and HTTP CONNECT, then traffic on a random sample: every
//! byte back in order, and no thread per idle tunnel. A parked tunnel
//! still times out (once, code 92), is still cut by a reload that denies
//! it (`force`), and is still held to its `bandlimin`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use crate::util::*;

/// The client side and the echo origin of the many-tunnels test, in one
/// python3 process (selectors, no thread per connection): opens N tunnels
/// through the services named on the command line, says `open N`, then on
/// `go K SEED PAUSE` sends a random payload through K random tunnels, one
/// after the other with PAUSE ms between them, and checks the echo byte
/// for byte (`ok K`), on `close` closes them all (`closed`).
const LOAD: &str = r#"
import random, resource, selectors, socket, struct, sys, threading, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
origin_port, http_port, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
targets = [(a.split(':')[0], int(a.split(':')[1])) for a in sys.argv[4:]]

lst = socket.socket()
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(('127.0.0.1', origin_port))
lst.listen(4096)
lst.setblocking(False)
hl = socket.socket()
hl.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
hl.bind(('127.0.0.1', http_port))
hl.listen(4096)
hl.setblocking(False)
sel = selectors.DefaultSelector()
sel.register(lst, selectors.EVENT_READ)
sel.register(hl, selectors.EVENT_READ)
out = {}
# The HTTP origin: each request's answer carries its path as the body.
http_in = {}
def echo():
    while True:
        for key, ev in sel.select():
            s = key.fileobj
            if s is lst or s is hl:
                try:
                    c, _ = s.accept()
                except BlockingIOError:
                    continue
                c.setblocking(False)
                out[c] = bytearray()
                if s is hl:
                    http_in[c] = bytearray()
                sel.register(c, selectors.EVENT_READ)
                continue
            buf = out[s]
            if ev & selectors.EVENT_READ:
                try:
                    d = s.recv(65536)
                except BlockingIOError:
                    d = None
                except OSError:
                    d = b''
                if d == b'':
                    sel.unregister(s); s.close(); del out[s]; http_in.pop(s, None)
                    continue
                if d and s in http_in:
                    req = http_in[s]
                    req += d
                    while b'\r\n\r\n' in req:
                        head, _, rest = bytes(req).partition(b'\r\n\r\n')
                        req[:] = rest
                        path = head.split(b' ')[1]
                        buf += b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n' % len(path) + path
                elif d:
                    buf += d
            if buf:
                try:
                    k = s.send(buf)
                except BlockingIOError:
                    k = 0
                except OSError:
                    sel.unregister(s); s.close(); del out[s]
                    continue
                del buf[:k]
            want = selectors.EVENT_WRITE if buf else 0
            if len(buf) < (1 << 20):
                want |= selectors.EVENT_READ
            sel.modify(s, want)
threading.Thread(target=echo, daemon=True).start()

def exact(c, n):
    got = bytearray()
    while len(got) < n:
        d = c.recv(n - len(got))
        if not d:
            raise SystemExit('EOF after %d of %d bytes' % (len(got), n))
        got += d
    return bytes(got)

def head(c):
    got = b''
    while not got.endswith(b'\r\n\r\n'):
        d = c.recv(1)
        if not d:
            raise SystemExit('EOF in the answer: %r' % got)
        got += d
    return got

def get(c, path):
    c.sendall(b'GET http://127.0.0.1:%d%s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n' % (http_port, path, http_port))
    h = head(c)
    if b' 200 ' not in h.split(b'\r\n')[0]:
        raise SystemExit('GET refused: %r' % h)
    n = int([l for l in h.split(b'\r\n') if l.lower().startswith(b'content-length:')][0].split(b':')[1])
    return exact(c, n)

tunnels = []
for i in range(n):
    kind, port = targets[i % len(targets)]
    c = socket.create_connection(('127.0.0.1', port), timeout=30)
    if kind == 'connect':
        c.sendall(b'CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n' % (origin_port, origin_port))
        h = head(c)
        if b' 200 ' not in h.split(b'\r\n')[0]:
            raise SystemExit('CONNECT refused: %r' % h)
    elif kind == 'socks':
        c.sendall(b'\x05\x01\x00')
        if exact(c, 2) != b'\x05\x00':
            raise SystemExit('SOCKS hello refused')
        c.sendall(b'\x05\x01\x00\x01\x7f\x00\x00\x01' + struct.pack('>H', origin_port))
        r = exact(c, 10)
        if r[1] != 0:
            raise SystemExit('SOCKS CONNECT refused: %r' % r)
    if kind == 'http':
        path = b'/client-%d' % i
        if get(c, path) != path:
            raise SystemExit('client %d: bad answer' % i)
        tunnels.append(c)
        continue
    msg = b'tunnel %d open\n' % i
    c.sendall(msg)
    if exact(c, len(msg)) != msg:
        raise SystemExit('tunnel %d: bad echo' % i)
    tunnels.append(c)
print('open', n, flush=True)

for line in sys.stdin:
    w = line.split()
    if w[0] == 'go':
        k = int(w[1])
        rnd = random.Random(int(w[2]))
        pause = int(w[3]) / 1000.0
        gets = 0
        for i in rnd.sample(range(n), k):
            time.sleep(pause)
            c = tunnels[i]
            if targets[i % len(targets)][0] == 'http':
                gets += 3
                for j in range(3):
                    path = b'/%d/%d/' % (i, j) + b'x' * rnd.randint(1, 3000)
                    if get(c, path) != path:
                        raise SystemExit('client %d: bad answer' % i)
                continue
            size = rnd.randint(1, 200000)
            data = bytes(rnd.getrandbits(8) for _ in range(min(size, 4096)))
            data = (data * (size // len(data) + 1))[:size]
            data = b'%d:' % i + data
            t = threading.Thread(target=c.sendall, args=(data,))
            t.start()
            back = exact(c, len(data))
            t.join()
            if back != data:
                raise SystemExit('tunnel %d (%s): the echo differs' % (i, targets[i % len(targets)][0]))
        print('ok', k, gets, flush=True)
    elif w[0] == 'close':
        for c in tunnels:
            c.close()
        print('closed', flush=True)
        break
"#;

/// The helper's process, its stdin and its stdout's lines.
struct Load {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Load {
    fn start(dir: &Dir, args: &[String]) -> Load {
        let script = dir.write("load.py", LOAD);
        let mut child = Command::new("python3")
            .arg(&script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 (tests/deps.sh installs it)");
        let stdin = child.stdin.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { return };
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Load {
            child,
            stdin,
            lines,
        }
    }

    fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write to the helper");
    }

    fn line(&mut self, within: Duration) -> String {
        match self.lines.recv_timeout(within) {
            Ok(l) => l,
            Err(_) => {
                let status = self.child.try_wait();
                panic!("the helper said nothing within {within:?} (exit: {status:?})");
            }
        }
    }

    fn expect(&mut self, want: &str, within: Duration) {
        let l = self.line(within);
        assert_eq!(l, want, "what the helper said");
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.0 GET to the admin service; the body.
fn admin_get(port: u16, path: &str) -> String {
    http_once(
        port,
        format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes(),
    )
    .text()
}

/// `threeproxy_parked_sessions` from `/metrics`.
pub fn parked(admin: u16) -> u64 {
    let body = admin_get(admin, "/metrics");
    body.lines()
        .find_map(|l| l.strip_prefix("threeproxy_parked_sessions "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no threeproxy_parked_sessions in /metrics:\n{body}"))
}

pub fn wait_parked(admin: u16, n: u64, within: Duration) {
    let mut last = 0;
    let ok = wait_for(
        || {
            last = parked(admin);
            last == n
        },
        within,
    );
    assert!(ok, "{last} sessions parked, want {n}");
}

#[test]
fn thousands_of_idle_tunnels_park_and_carry_on() {
    // Each tunnel takes two descriptors in the proxy and two in the
    // helper; both raise their limit to the hard one.
    let hard = open_files_hard_limit().unwrap_or(1024);
    let n = 5000.min(hard.saturating_sub(400) / 2) as usize;
    assert!(
        n >= 2000,
        "the hard limit on open files ({hard}) allows {n} tunnels; this test needs 2,000 (4,400 descriptors)"
    );
    let n = n - n % 4;
    let dir = Dir::new("park_many");
    let log = dir.join("access.log");
    let (origin, http) = (free_port(), free_port());
    let (tport, sport, pport, aport) = (free_port(), free_port(), free_port(), free_port());
    let cfg = format!(
        // STRING_SHORT 300 s: the kept-alive HTTP clients stay open (and
        // parked) through the whole test, paced traffic included.
        "log {}\nlogformat \"L%N %E %O %I %T\"\nmaxconn 10000\nparklinger 100\n\
         timeouts 1 5 300 600 180 1800 15 60\n\
         admin -i127.0.0.1 -p{aport}\n\
         tcppm -i127.0.0.1 {tport} 127.0.0.1 {origin}\n\
         socks -i127.0.0.1 -p{sport}\nproxy -i127.0.0.1 -p{pport}\n",
        p(&log)
    );
    let ready = [tport, sport, pport, aport].map(|p| Listen::Tcp(localhost(p)));
    let proxy = Proxy::start_nofile(dir, &cfg, &ready, hard.min(1 << 20));
    let mut load = Load::start(
        &proxy.dir,
        &[
            origin.to_string(),
            http.to_string(),
            n.to_string(),
            format!("tcppm:{tport}"),
            format!("socks:{sport}"),
            format!("connect:{pport}"),
            format!("http:{pport}"),
        ],
    );
    load.expect(&format!("open {n}"), Duration::from_secs(180));
    wait_parked(aport, n as u64, Duration::from_secs(10));
    // The threads that served them go back to their services' idle stacks
    // and leave after 15 s there: then no thread is left per tunnel. (The
    // main thread, the lot, the log writer, four acceptors, a few idle.)
    let mut threads = 0;
    let few = wait_for(
        || {
            threads = proxy.threads();
            threads <= 24
        },
        Duration::from_secs(40),
    );
    assert!(few, "{threads} threads for {n} idle tunnels");
    let rss = proxy.rss_kb();
    eprintln!("{n} parked tunnels: {threads} threads, {rss} kB resident");

    // Traffic on a random sample, one tunnel at a time: each wakes, moves
    // its bytes in order, and parks again. The next starts after the
    // linger, so one session at a time is active: tunnels taken back to
    // back would each hold a thread for the linger, as many at once as
    // the machine's speed packs into 100 ms (65 on a quiet machine).
    let sample = 80;
    load.say(&format!("go {sample} {} 150", std::process::id()));
    let said = load.line(Duration::from_secs(120));
    let gets: usize = said
        .strip_prefix(&format!("ok {sample} "))
        .and_then(|g| g.parse().ok())
        .unwrap_or_else(|| panic!("the helper said {said:?}, want \"ok {sample} GETS\""));
    // Each tunnel lingered 100 ms on its thread, then parked again, and
    // the thread waited on its service's idle stack for the next one: a
    // thread or two per service, not one per tunnel.
    let after = proxy.threads();
    assert!(
        after <= threads + 12,
        "{after} threads after traffic on {sample} tunnels one at a time (before: {threads})"
    );
    wait_parked(aport, n as u64, Duration::from_secs(10));

    // Closed by the clients: one record each tunnel, one each request,
    // nothing cut.
    load.say("close");
    load.expect("closed", Duration::from_secs(60));
    let records = || {
        log_lines(&log)
            .into_iter()
            .filter(|l| {
                let svc = l.starts_with("TCPPM ") || l.starts_with("SOCK5 ");
                // Not the services' own records ("Accepting connections")
                // nor the readiness probes': no byte either way.
                let w: Vec<&str> = l.split(' ').collect();
                let empty = w.get(2) == Some(&"0") && w.get(3) == Some(&"0");
                (svc || l.starts_with("PROXY ")) && !empty
            })
            .collect::<Vec<_>>()
    };
    // A request each kept-alive client at the start, three each sampled.
    let tunnels = |recs: &[String]| recs.iter().filter(|l| !l.contains(" GET ")).count();
    let done = wait_for(|| tunnels(&records()) >= n / 4 * 3, Duration::from_secs(60));
    let recs = records();
    assert!(done, "{} records for {} tunnels", tunnels(&recs), n / 4 * 3);
    assert_eq!(tunnels(&recs), n / 4 * 3, "one record per tunnel");
    for r in &recs {
        let w: Vec<&str> = r.split(' ').collect();
        assert_eq!(w[1], "00000", "a session ended badly: {r}");
        if !r.starts_with("PROXY ") {
            // An echo: as many bytes back as out.
            assert_eq!(w[2], w[3], "bytes out and in differ: {r}");
        }
    }
    // Every request of the kept-alive clients has its record, the first
    // ones and those after they parked.
    let first = recs
        .iter()
        .filter(|l| l.contains(" GET ") && l.contains("/client-"))
        .count();
    assert_eq!(first, n / 4, "one record per first request");
    let later = recs
        .iter()
        .filter(|l| l.contains(" GET ") && !l.contains("/client-"))
        .count();
    assert_eq!(later, gets, "three requests per sampled client");
    assert_eq!(parked(aport), 0);
}

/// A tcppm service with `parklinger 100`, idle timeout `idle` seconds
/// (CONNECTION_LONG) and `extra` lines before it; the proxy, its port and
/// the admin port.
fn tcppm_with(name: &str, idle: u32, extra: &str, to: u16) -> (Proxy, u16, u16) {
    let dir = Dir::new(name);
    let (port, aport) = (free_port(), free_port());
    let cfg = tcppm_cfg(&dir.join("access.log"), idle, extra, port, aport, to);
    let ready = [Listen::Tcp(localhost(port)), Listen::Tcp(localhost(aport))];
    (Proxy::start(dir, &cfg, &ready), port, aport)
}

fn tcppm_cfg(
    log: &std::path::Path,
    idle: u32,
    extra: &str,
    port: u16,
    aport: u16,
    to: u16,
) -> String {
    format!(
        "log {}\nlogformat \"L%N %E %c %O %I\"\nparklinger 100\n\
         timeouts 1 5 30 60 180 {idle} 15 60 15 5 10\n\
         admin -i127.0.0.1 -p{aport}\n{extra}tcppm -i127.0.0.1 {port} 127.0.0.1 {to}\n",
        p(log)
    )
}

#[test]
fn a_parked_tunnel_times_out_once() {
    let origin = Origin::echo();
    let (proxy, port, aport) = tcppm_with("park_idle", 2, "", origin.port());
    let mut s = connect(localhost(port));
    set_timeouts(&s, IO_TIMEOUT);
    echo_roundtrip(&mut s, b"hello");
    let quiet = Instant::now();
    wait_parked(aport, 1, Duration::from_secs(2));
    // Parked, its idle time still runs out: closed 2 s after the last byte.
    let mut b = [0u8; 1];
    assert_eq!(s.read(&mut b).unwrap(), 0, "closed by the proxy");
    let after = quiet.elapsed();
    assert!(
        after >= Duration::from_millis(1800) && after < Duration::from_secs(4),
        "closed {after:?} after the last byte, want 2 s"
    );
    let me = s.local_addr().unwrap().port();
    let log = proxy.dir.join("access.log");
    read_log_line(&log, "the idle record", |l| l.contains(&format!(" {me} ")));
    thread::sleep(Duration::from_millis(300));
    let mine: Vec<String> = log_lines(&log)
        .into_iter()
        .filter(|l| l.starts_with("TCPPM ") && l.contains(&format!(" {me} ")))
        .collect();
    assert_eq!(
        mine,
        [format!("TCPPM 00092 {me} 5 5")],
        "one record, code 92"
    );
    assert_eq!(parked(aport), 0);
}

#[test]
fn a_reload_that_denies_a_parked_tunnel_ends_it() {
    let (kept, cut) = (Origin::echo(), Origin::echo());
    let dir = Dir::new("park_reload");
    let log = dir.join("access.log");
    let logp = &log;
    let (port, port2, aport) = (free_port(), free_port(), free_port());
    let two = |acl: &str| {
        format!(
            "{}tcppm -i127.0.0.1 {port2} 127.0.0.1 {}\n",
            tcppm_cfg(logp, 60, acl, port, aport, cut.port()),
            kept.port()
        )
    };
    let allow = two("auth iponly\nallow *\n");
    let ready = [
        Listen::Tcp(localhost(port)),
        Listen::Tcp(localhost(port2)),
        Listen::Tcp(localhost(aport)),
    ];
    let proxy = Proxy::start(dir, &allow, &ready);
    let mut a = connect(localhost(port));
    let mut b = connect(localhost(port2));
    set_timeouts(&a, IO_TIMEOUT);
    set_timeouts(&b, IO_TIMEOUT);
    echo_roundtrip(&mut a, b"before");
    echo_roundtrip(&mut b, b"before");
    wait_parked(aport, 2, Duration::from_secs(2));
    // The new ACL denies the first tunnel's destination only.
    let deny = two(&format!(
        "auth iponly\ndeny * * 127.0.0.1 {}\nallow *\n",
        cut.port()
    ));
    proxy.dir.write("3proxy.cfg", &deny);
    proxy.signal("USR1");
    // Nothing is sent: the lot hands the parked tunnel back to be checked,
    // and the check ends it.
    let t = Instant::now();
    let mut buf = [0u8; 1];
    assert_eq!(a.read(&mut buf).unwrap(), 0, "the denied tunnel was closed");
    assert!(t.elapsed() < Duration::from_secs(5));
    let me = a.local_addr().unwrap().port();
    let line = read_log_line(&log, "the denied tunnel's record", |l| {
        l.contains(&format!(" {me} "))
    });
    assert!(line.starts_with("TCPPM 00001 "), "{line}");
    // The other one is still allowed: checked, parked again, and on.
    wait_parked(aport, 1, Duration::from_secs(5));
    echo_roundtrip(&mut b, b"after the reload");
    thread::sleep(Duration::from_millis(300));
    let mine = log_lines(&log)
        .iter()
        .filter(|l| l.contains(&format!(" {me} ")))
        .count();
    assert_eq!(mine, 1, "one record for the denied tunnel");
}

#[test]
fn bandlimin_holds_after_a_tunnel_parked() {
    // 800 kbit/s: 100 kB a second towards the client.
    let origin = Origin::echo();
    let (proxy, port, aport) =
        tcppm_with("park_bandlim", 60, "bandlimin 800000 *\n", origin.port());
    let mut s = connect(localhost(port));
    set_timeouts(&s, IO_TIMEOUT);
    echo_roundtrip(&mut s, b"hello");
    wait_parked(aport, 1, Duration::from_secs(2));
    // Woken by 300 kB, which the echo sends back at the limited rate.
    let data = vec![7u8; 300_000];
    let mut w = s.try_clone().unwrap();
    let t = Instant::now();
    let send = {
        let data = data.clone();
        thread::spawn(move || w.write_all(&data).unwrap())
    };
    let mut back = vec![0u8; data.len()];
    s.read_exact(&mut back).unwrap();
    let took = t.elapsed();
    send.join().unwrap();
    assert_eq!(back, data);
    assert!(
        took >= Duration::from_millis(2000) && took < Duration::from_secs(6),
        "300 kB at 800 kbit/s took {took:?}, want about 3 s"
    );
    wait_parked(aport, 1, Duration::from_secs(2));
    drop(s);
    let log = proxy.dir.join("access.log");
    read_log_line(&log, "the record", |l| {
        l.starts_with("TCPPM 00000 ") && l.ends_with(" 300005 300005")
    });
}

/// A sanity check of the test's own means: with `parklinger 0` nothing
/// parks.
#[test]
fn parklinger_0_never_parks() {
    let origin = Origin::echo();
    let (_proxy, port, aport) = tcppm_with("park_off", 60, "parklinger 0\n", origin.port());
    let mut s = connect(localhost(port));
    set_timeouts(&s, IO_TIMEOUT);
    echo_roundtrip(&mut s, b"hello");
    thread::sleep(Duration::from_millis(500));
    assert_eq!(parked(aport), 0);
    echo_roundtrip(&mut s, b"still here");
    let _ = TcpStream::connect(localhost(port));
}

/// GET `/hello` of `origin` through the proxy on `s`; the answer's body.
fn get_hello(s: &mut TcpStream, origin: u16) -> Vec<u8> {
    get_path(s, origin, "/hello")
}

fn get_path(s: &mut TcpStream, origin: u16, path: &str) -> Vec<u8> {
    // One write: write! would send its pieces one by one, and Nagle holds
    // the second until the first is acknowledged (a delayed ACK, 40 ms).
    let req = format!("GET http://127.0.0.1:{origin}{path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    // A client on a copy of the socket: the answer is framed by its
    // Content-Length, so nothing of a later one is read with it.
    let mut c = HttpClient::on(s.try_clone().unwrap());
    c.send(req.as_bytes());
    let r = c.read(false);
    assert!(r.head.starts_with("HTTP/1.1 200 "), "{r}");
    assert!(
        r.field("content-length").is_some(),
        "no Content-Length: {r}"
    );
    r.body
}

/// A kept-alive HTTP client parks between its requests, goes on when it
/// sends the next, and is closed (with no record) when it sends none
/// within STRING_SHORT, as when a thread waits for it.
#[test]
fn a_kept_alive_http_client_parks_between_requests() {
    let origin = crate::http::HttpOrigin::start();
    let dir = Dir::new("park_http");
    let log = dir.join("access.log");
    let (port, aport) = (free_port(), free_port());
    let cfg = format!(
        "log {}\nlogformat \"L%N %E %c %T\"\nparklinger 100\n\
         timeouts 1 5 2 60 180 1800 15 60 15 5 10\n\
         admin -i127.0.0.1 -p{aport}\nproxy -i127.0.0.1 -p{port}\n",
        p(&log)
    );
    let ready = [Listen::Tcp(localhost(port)), Listen::Tcp(localhost(aport))];
    let _proxy = Proxy::start(dir, &cfg, &ready);
    let mut s = connect(localhost(port));
    set_timeouts(&s, IO_TIMEOUT);
    assert_eq!(get_hello(&mut s, origin.port()), b"hello");
    wait_parked(aport, 1, Duration::from_secs(2));
    assert_eq!(get_hello(&mut s, origin.port()), b"hello");
    let quiet = Instant::now();
    wait_parked(aport, 1, Duration::from_secs(2));
    let mut b = [0u8; 1];
    assert_eq!(s.read(&mut b).unwrap(), 0, "closed by the proxy");
    let after = quiet.elapsed();
    assert!(
        after >= Duration::from_millis(1800) && after < Duration::from_secs(4),
        "closed {after:?} after the answer, want 2 s (STRING_SHORT)"
    );
    thread::sleep(Duration::from_millis(300));
    let me = s.local_addr().unwrap().port();
    let mine: Vec<String> = log_lines(&log)
        .into_iter()
        .filter(|l| l.starts_with("PROXY ") && l.contains(&format!(" {me} ")))
        .collect();
    assert_eq!(
        mine.len(),
        2,
        "a record per request, none for the end: {mine:?}"
    );
    assert!(
        mine.iter().all(|l| l.starts_with("PROXY 00000 ")),
        "{mine:?}"
    );
}

/// What a kept-alive HTTP client's session carries from one request to
/// the next survives a park: with `-a1` each client gets one made-up
/// X-Forwarded-For address, and its requests after a park still carry
/// that same one (and the same Via).
#[test]
fn a_parked_http_client_keeps_its_forwarding_fields() {
    let origin = crate::http::HttpOrigin::start();
    let dir = Dir::new("park_http_fields");
    let (port, aport, fport) = (free_port(), free_port(), free_port());
    let cfg = format!(
        "log /dev/null\nparklinger 100\n\
         admin -i127.0.0.1 -p{aport}\nproxy -a1 -i127.0.0.1 -p{port}\n\
         proxy -i127.0.0.1 -p{fport}\n"
    );
    let ready = [
        Listen::Tcp(localhost(port)),
        Listen::Tcp(localhost(aport)),
        Listen::Tcp(localhost(fport)),
    ];
    let _proxy = Proxy::start(dir, &cfg, &ready);
    let fields = |head: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(head)
            .lines()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                l.starts_with("x-forwarded-for:")
                    || l.starts_with("via:")
                    || l.starts_with("forwarded:")
            })
            .map(str::to_string)
            .collect()
    };
    let mut seen = Vec::new();
    for _ in 0..2 {
        let mut s = connect(localhost(port));
        set_timeouts(&s, IO_TIMEOUT);
        let before = fields(&get_path(&mut s, origin.port(), "/head"));
        assert_eq!(before.len(), 2, "Via and X-Forwarded-For: {before:?}");
        wait_parked(aport, 1, Duration::from_secs(2));
        let after = fields(&get_path(&mut s, origin.port(), "/head"));
        assert_eq!(after, before, "the fields changed across a park");
        seen.push(before);
    }
    // Two clients, two made-up addresses (1 in 2^24 of a false failure).
    assert_ne!(seen[0], seen[1], "-a1 gave both clients one address");

    // Without -a the fields are made again on resume, from the client.
    let mut s = connect(localhost(fport));
    set_timeouts(&s, IO_TIMEOUT);
    let me = s.local_addr().unwrap();
    let before = fields(&get_path(&mut s, origin.port(), "/head"));
    assert_eq!(before.len(), 1, "Forwarded: {before:?}");
    let f = &before[0];
    assert!(
        f.starts_with(&format!("Forwarded: for=\"{me}\";by=\""))
            && f.ends_with(&format!(":{fport}\"")),
        "{f}"
    );
    wait_parked(aport, 1, Duration::from_secs(2));
    assert_eq!(
        fields(&get_path(&mut s, origin.port(), "/head")),
        before,
        "the Forwarded field after a park"
    );
}

/// Beyond 64 sessions lingering at once, the later ones linger a tenth
/// as long (`park::Lingering`): of 100 kept-alive clients that go quiet
/// together under `parklinger 5000`, the last 36 park within about half a
/// second, the first 64 only after their 5 s; every one carries on.
#[test]
fn a_crowd_of_quiet_clients_parks_sooner() {
    let origin = crate::http::HttpOrigin::start();
    let dir = Dir::new("park_crowd");
    let (port, aport) = (free_port(), free_port());
    let cfg = format!(
        "log /dev/null\nparklinger 5000\n\
         admin -i127.0.0.1 -p{aport}\nproxy -i127.0.0.1 -p{port}\n"
    );
    let ready = [Listen::Tcp(localhost(port)), Listen::Tcp(localhost(aport))];
    let _proxy = Proxy::start(dir, &cfg, &ready);
    let first = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..100 {
        let mut s = connect(localhost(port));
        set_timeouts(&s, IO_TIMEOUT);
        assert_eq!(get_hello(&mut s, origin.port()), b"hello");
        clients.push(s);
    }
    let opened = first.elapsed();
    assert!(
        opened < Duration::from_secs(4),
        "opening 100 clients took {opened:?}: the first would stop lingering"
    );
    wait_parked(aport, 36, Duration::from_secs(3));
    let at = first.elapsed();
    assert!(
        at < Duration::from_millis(4900),
        "36 parked only after {at:?}: no shorter linger"
    );
    wait_parked(aport, 100, Duration::from_secs(8));
    for s in clients.iter_mut().step_by(9) {
        assert_eq!(get_hello(s, origin.port()), b"hello");
    }
}
