//! LdapPlugin's `auth ldap` against a real OpenLDAP `slapd` (Debian's
//! `slapd` and `ldap-utils`, which tests/deps.sh installs), run in the
//! foreground on a loopback port with a slapd.conf and an mdb database
//! each test writes in its own dir, its users loaded with ldapadd: the
//! right and a wrong password, the `ldapaccess` group, `ldapattr`'s
//! lowercasing, a server that is down or does not answer, and
//! `authcache`.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::*;

const SUFFIX: &str = "dc=test";
const ADMIN: &str = "cn=admin,dc=test";
const ADMIN_PW: &str = "adminpw";

/// alice is in the `internet` group (the `ou` attribute), bob is not;
/// alice, Carol and `x..y` are in the `traf` group (`ldaptrafgroup`).
const USERS: &str = "dn: dc=test
objectClass: dcObject
objectClass: organization
o: test
dc: test

dn: ou=people,dc=test
objectClass: organizationalUnit
ou: people

dn: uid=alice,ou=people,dc=test
objectClass: inetOrgPerson
uid: alice
cn: alice
sn: A
ou: internet
ou: traf
userPassword: alicepw

dn: uid=bob,ou=people,dc=test
objectClass: inetOrgPerson
uid: bob
cn: bob
sn: B
userPassword: bobpw

dn: uid=Carol,ou=people,dc=test
objectClass: inetOrgPerson
uid: Carol
cn: carol
sn: C
ou: traf

dn: uid=x..y,ou=people,dc=test
objectClass: inetOrgPerson
uid: x..y
cn: x
sn: X
ou: traf
";

/// A slapd in the foreground (`-d 256`: its stats log, one line per
/// operation, on stderr into `slapd.log`), killed on drop.
struct Slapd {
    child: Option<Child>,
    port: u16,
    log: PathBuf,
}

impl Slapd {
    fn start(dir: &Dir) -> Slapd {
        let port = free_port();
        let d = dir.join(&format!("slapd-{port}"));
        std::fs::create_dir_all(d.join("db")).unwrap();
        let dd = p(&d).to_string();
        let conf = format!(
            "include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile {dd}/slapd.pid
database mdb
suffix \"{SUFFIX}\"
rootdn \"{ADMIN}\"
rootpw {ADMIN_PW}
directory {dd}/db
maxsize 10485760
"
        );
        std::fs::write(d.join("slapd.conf"), conf).unwrap();
        std::fs::write(d.join("users.ldif"), USERS).unwrap();
        let log = d.join("slapd.log");
        let child = Command::new(sbin("slapd"))
            .args(["-f", &format!("{dd}/slapd.conf")])
            .args(["-h", &format!("ldap://127.0.0.1:{port}/")])
            .args(["-d", "256"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start slapd (tests/deps.sh installs it)");
        let s = Slapd {
            child: Some(child),
            port,
            log,
        };
        assert!(
            wait_for(
                || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
                Duration::from_secs(10)
            ),
            "slapd did not listen: {}",
            s.log_text()
        );
        let out = Command::new("ldapadd")
            .args(["-x", "-H", &s.url(), "-D", ADMIN, "-w", ADMIN_PW, "-f"])
            .arg(d.join("users.ldif"))
            .output()
            .expect("run ldapadd (tests/deps.sh installs ldap-utils)");
        assert!(
            out.status.success(),
            "ldapadd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        s
    }

    fn url(&self) -> String {
        format!("ldap://127.0.0.1:{}", self.port)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many binds slapd has been asked for with `dn` (its first line
    /// of each; a successful one has a second, with `mech=`).
    fn binds(&self, dn: &str) -> usize {
        let want = format!("BIND dn=\"{dn}\" method=128");
        self.log_text()
            .lines()
            .filter(|l| l.contains(&want))
            .count()
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Slapd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An HTTP origin that answers every request with `ldap ok`.
fn origin() -> Origin {
    crate::radius::http_origin("ldap ok")
}

/// A GET through the proxy, with Basic credentials when `login` is set.
fn get(proxy: u16, origin: u16, login: Option<(&str, &str)>) -> Response {
    let auth = login.map(|(u, pw)| proxy_auth(u, pw)).unwrap_or_default();
    let request = format!(
        "GET http://127.0.0.1:{origin}/x HTTP/1.1\r\nHost: 127.0.0.1:{origin}\r\n\
         {auth}Connection: close\r\n\r\n"
    );
    http_once(proxy, request.as_bytes())
}

/// The plugin's lines for a server on `server` (host:port), with
/// `ldapattr`'s lowercasing set to `lower`.
fn plugin_lines(server: &str, lower: u8) -> String {
    format!(
        "plugin /usr/local/3proxy/libexec/LdapPlugin.ld.so start\n\
         ldapconnect {server} {ADMIN} {ADMIN_PW}\n\
         ldapattr uid ou {lower}\n\
         ldapuserenv ou=people,{SUFFIX}\n\
         ldapsbase {SUFFIX}\n\
         ldapaccess internet\n"
    )
}

/// A proxy with `pre`, then `auth`, the plugin's lines after the auth
/// line (3proxy reads them at each login, so they may come later), and
/// an ACL for every user; logs `%U %E`.
fn start_proxy(dir: Dir, pre: &str, auth: &str, server: &str, lower: u8) -> (Proxy, u16, PathBuf) {
    let cfg = format!(
        "{pre}plugin LdapPlugin.ld.so start\n{auth}\n{}allow *\n",
        plugin_lines(server, lower)
    );
    Service::tcp("proxy", "L%U %E").start_in(dir, &cfg, "", "")
}

#[test]
fn password_group_and_lowercase() {
    let dir = Dir::new("ldap_login");
    let ldap = Slapd::start(&dir);
    let origin = origin();
    let server = format!("127.0.0.1:{}", ldap.port);
    let (_proxy, port, log) = start_proxy(dir, "", "auth ldap", &server, 1);
    // ldapadd's bind.
    assert_eq!(ldap.binds(ADMIN), 1, "{}", ldap.log_text());

    let ok = get(port, origin.port(), Some(("alice", "alicepw")));
    assert_eq!(ok.status, 200, "{ok}");
    assert!(ok.text().ends_with("ldap ok"), "{ok}");
    read_log_line(&log, "alice let in (0)", |l| l == "alice 00000");
    assert_eq!(ldap.binds("uid=alice,ou=people,dc=test"), 1);
    assert_eq!(ldap.binds(ADMIN), 2, "{}", ldap.log_text());

    // A wrong password: the user's bind fails, code 7.
    let no = get(port, origin.port(), Some(("alice", "wrong")));
    assert_eq!(no.status, 407, "{no}");
    assert!(no.head.contains("Proxy-Authenticate: Basic"), "{no}");
    read_log_line(&log, "alice's wrong password (7)", |l| l == "alice 00007");

    // bob's password is right, but he is not in the ldapaccess group.
    let bob = get(port, origin.port(), Some(("bob", "bobpw")));
    assert_eq!(bob.status, 407, "{bob}");
    read_log_line(&log, "bob outside the group (5)", |l| l == "bob 00005");
    assert_eq!(ldap.binds("uid=bob,ou=people,dc=test"), 1);

    // No credentials, or an empty password: 4, and slapd is not asked.
    let before = ldap.binds(ADMIN);
    let none = get(port, origin.port(), None);
    assert_eq!(none.status, 407, "{none}");
    let empty = get(port, origin.port(), Some(("alice", "")));
    assert_eq!(empty.status, 407, "{empty}");
    read_log_line(&log, "alice's empty password (4)", |l| l == "alice 00004");
    assert_eq!(ldap.binds(ADMIN), before);

    // ldapattr's 1: the name is lowercased before the bind, and the log
    // shows the lowercased name.
    let upper = get(port, origin.port(), Some(("ALICE", "alicepw")));
    assert_eq!(upper.status, 200, "{upper}");
    read_log_line(&log, "ALICE as alice", |l| l == "alice 00000");
    assert_eq!(ldap.binds("uid=alice,ou=people,dc=test"), 3);

    // A name with filter and DN specials is escaped, not injected.
    let star = get(port, origin.port(), Some(("*", "alicepw")));
    assert_eq!(star.status, 407, "{star}");
    let comma = get(port, origin.port(), Some(("alice,ou=people", "alicepw")));
    assert_eq!(comma.status, 407, "{comma}");
    assert!(
        ldap.binds("uid=alice\\2Cou\\3Dpeople,ou=people,dc=test") == 1,
        "{}",
        ldap.log_text()
    );
    assert_eq!(origin.peers().len(), 2, "refused logins reached the origin");
}

#[test]
fn without_lowercase_the_name_is_bound_as_given() {
    let dir = Dir::new("ldap_case");
    let ldap = Slapd::start(&dir);
    let origin = origin();
    let server = format!("127.0.0.1:{}", ldap.port);
    let (_proxy, port, log) = start_proxy(dir, "", "auth ldap", &server, 0);
    // slapd compares uid without case: the bind and the search succeed,
    // and the log keeps the name as the client sent it.
    let upper = get(port, origin.port(), Some(("ALICE", "alicepw")));
    assert_eq!(upper.status, 200, "{upper}");
    read_log_line(&log, "ALICE kept", |l| l == "ALICE 00000");
    assert_eq!(ldap.binds("uid=ALICE,ou=people,dc=test"), 1);
}

#[test]
fn server_down_or_silent_is_7_within_the_timeout() {
    let dir = Dir::new("ldap_down");
    let mut ldap = Slapd::start(&dir);
    let origin = origin();
    let server = format!("127.0.0.1:{}", ldap.port);
    // A listener that accepts and never answers, as a hung server does.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in silent.incoming().take(1).flatten() {
            conns.push(c);
        }
        std::thread::sleep(Duration::from_secs(8));
        drop(conns);
    });
    // BYTE_LONG (the second value) is each LDAP step's time limit.
    let (_proxy, port, log) = start_proxy(
        dir,
        "timeouts 1 1 5 30 60 180 1800 15 60\n",
        "auth ldap",
        &server,
        0,
    );
    let (_silent_proxy, silent_proxy_port, silent_log) = start_proxy(
        Dir::new("ldap_silent"),
        "timeouts 1 1 5 30 60 180 1800 15 60\n",
        "auth ldap",
        &format!("127.0.0.1:{silent_port}"),
        0,
    );
    let ok = get(port, origin.port(), Some(("alice", "alicepw")));
    assert_eq!(ok.status, 200, "{ok}");

    ldap.stop();
    let t = Instant::now();
    let down = get(port, origin.port(), Some(("alice", "alicepw")));
    let took = t.elapsed();
    assert_eq!(down.status, 407, "{down}");
    assert!(
        took < Duration::from_secs(2),
        "a refused connect took {took:?}"
    );
    read_log_line(&log, "server down (7)", |l| l == "alice 00007");

    let t = Instant::now();
    let hung = get(silent_proxy_port, origin.port(), Some(("alice", "alicepw")));
    let took = t.elapsed();
    assert_eq!(hung.status, 407, "{hung}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "a silent server's bind took {took:?} (BYTE_LONG is 1 s)"
    );
    read_log_line(&silent_log, "server silent (7)", |l| l == "alice 00007");
    held.join().unwrap();
}

#[test]
fn authcache_spares_the_directory() {
    let dir = Dir::new("ldap_cache");
    let mut ldap = Slapd::start(&dir);
    let origin = origin();
    let server = format!("127.0.0.1:{}", ldap.port);
    let (_proxy, port, log) = start_proxy(
        dir,
        "timeouts 1 1 5 30 60 180 1800 15 60\nauthcache user,password 60\n",
        "auth cache ldap",
        &server,
        0,
    );
    let first = get(port, origin.port(), Some(("alice", "alicepw")));
    assert_eq!(first.status, 200, "{first}");
    let second = get(port, origin.port(), Some(("alice", "alicepw")));
    assert_eq!(second.status, 200, "{second}");
    assert_eq!(
        ldap.binds("uid=alice,ou=people,dc=test"),
        1,
        "the second login reached slapd"
    );
    // With slapd gone, the cached login still passes; another password
    // is not in the cache and goes to the (absent) directory: 7.
    ldap.stop();
    let third = get(port, origin.port(), Some(("alice", "alicepw")));
    assert_eq!(third.status, 200, "{third}");
    let other = get(port, origin.port(), Some(("alice", "other")));
    assert_eq!(other.status, 407, "{other}");
    read_log_line(&log, "uncached password with slapd down", |l| {
        l == "alice 00007"
    });
}

#[test]
fn cfg_errors() {
    let dir = Dir::new("ldap_cfg");
    let cfg = dir.cfg_path();
    let f = run_check(
        &dir,
        "plugin LdapPlugin.ld.so start\nauth ldap\nldapconnect 127.0.0.1 cn=a\n",
    );
    let e = f.assert_cfg_error(&cfg, 3, "auth");
    assert!(
        e.contains("ldapattr, ldapuserenv, ldapsbase, ldapaccess"),
        "{e}"
    );
    let f = run_check(&dir, "auth ldap\n");
    let e = f.assert_cfg_error(&cfg, 1, "auth");
    assert!(e.contains("LdapPlugin"), "{e}");
    let f = run_check(&dir, "ldapsbase dc=x\n");
    f.assert_cfg_error(&cfg, 1, "ldapsbase");
    let f = run_check(
        &dir,
        "plugin ldapauth.so start\nldaptrafgroup cn=traf,dc=x MONTHLY 200 60000\n",
    );
    let e = f.assert_cfg_error(&cfg, 2, "ldaptrafgroup");
    assert!(e.contains("needs ldapconnect before it"), "{e}");
    // Without `auth ldap` the settings need not be complete.
    let f = run_check(&dir, "plugin ldapauth.so start\nldapdircount /tmp/\n");
    assert!(f.status.success(), "{}", f.stderr);
}

#[test]
fn parallel_logins_each_get_their_answer() {
    let dir = Dir::new("ldap_parallel");
    let ldap = Slapd::start(&dir);
    let origin = origin();
    let server = format!("127.0.0.1:{}", ldap.port);
    let (_proxy, port, _log) = start_proxy(dir, "", "auth ldap", &server, 0);
    let o = origin.port();
    // Checks run at once, each on a thread and a connection of its own.
    let workers: Vec<_> = (0..12)
        .map(|i| {
            std::thread::spawn(move || {
                let (user, pw, want) = match i % 3 {
                    0 => ("alice", "alicepw", 200),
                    1 => ("alice", "nope", 407),
                    _ => ("bob", "bobpw", 407),
                };
                let r = get(port, o, Some((user, pw)));
                assert_eq!(r.status, want, "{user}/{pw}: {r}");
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(ldap.binds("uid=alice,ou=people,dc=test"), 8);
    assert_eq!(ldap.binds("uid=bob,ou=people,dc=test"), 4);
    assert_eq!(origin.peers().len(), 4);
}

/// An origin that answers every request with `len` bytes of `x`.
fn sized_origin(len: usize) -> Origin {
    Origin::start("127.0.0.1:0", move |mut c| {
        let mut b = [0u8; 2048];
        let _ = c.read(&mut b);
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n");
        let _ = c.write_all(head.as_bytes());
        let _ = c.write_all(&vec![b'x'; len]);
    })
}

/// The three numbers of an `.lc` file.
fn lc(path: &std::path::Path) -> Vec<u64> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        text.ends_with('\n') && text.lines().count() == 1,
        "{text:?}"
    );
    text.split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect()
}

/// `ldaptrafgroup traf DAILY LIMIT RATE`: the directory is asked for the
/// group's members while the cfg loads; each gets a bandwidth limit of
/// RATE bits/s and a counter of LIMIT bytes a day, read from and written
/// to `ldapdircount`'s DIR/NAME.lc; a member's name that could leave
/// DIR is passed over; someone outside the group has neither.
#[test]
fn trafgroup_limits_and_counts_the_groups_members() {
    let dir = Dir::new("ldap_trafgroup");
    let ldap = Slapd::start(&dir);
    let counts = dir.join("counts");
    std::fs::create_dir_all(&counts).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // alice used 60,000 of her 100,000 bytes today already.
    std::fs::write(counts.join("alice.lc"), format!("60000 {now} {now}\n")).unwrap();
    let origin = sized_origin(40_000);
    let pp = free_port();
    let cfg = format!(
        "log {log}\nlogformat \"L%U %E %I\"\nauth strong\n\
         users alice:CL:alicepw bob:CL:bobpw carol:CL:carolpw\n\
         plugin LdapPlugin.ld.so start\n\
         ldapconnect 127.0.0.1:{port} {ADMIN} {ADMIN_PW}\n\
         ldapattr uid ou 1\nldapsbase {SUFFIX}\nldapdircount {counts}/\n\
         ldaptrafgroup traf DAILY 100000 160000\nallow *\nproxy -i127.0.0.1 -p{pp}\n",
        log = p(&dir.join("access.log")),
        port = ldap.port,
        counts = p(&counts),
    );
    let log = dir.join("access.log");
    let mut proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(pp))]);
    // The cfg's load searched the directory as ldapconnect's DN.
    assert_eq!(ldap.binds(ADMIN), 2, "{}", ldap.log_text());

    // bob is outside the group: no rate, no counter.
    let t = Instant::now();
    let r = get(pp, origin.port(), Some(("bob", "bobpw")));
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.body.len(), 40_000);
    let fast = t.elapsed();
    assert!(fast < Duration::from_millis(700), "bob took {fast:?}");

    // alice: 40,000 bytes at 160,000 bits/s (20,000 bytes a second)
    // take about two seconds, less what the first read takes at once.
    let t = Instant::now();
    let r = get(pp, origin.port(), Some(("alice", "alicepw")));
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.body.len(), 40_000);
    let slow = t.elapsed();
    assert!(
        slow > Duration::from_millis(1200) && slow < Duration::from_secs(6),
        "alice took {slow:?}"
    );
    read_log_line(&log, "alice's first request", |l| {
        l.starts_with("alice 00000")
    });
    // Now over her 100,000 bytes: refused (10), before the origin is
    // asked; bob goes on.
    let before = origin.peers().len();
    let r = get(pp, origin.port(), Some(("alice", "alicepw")));
    assert_eq!(r.status, 503, "{r}");
    read_log_line(&log, "alice over her limit", |l| {
        l.starts_with("alice 00010")
    });
    assert_eq!(origin.peers().len(), before);
    let r = get(pp, origin.port(), Some(("bob", "bobpw")));
    assert_eq!(r.status, 200, "{r}");

    // carol (Carol in the directory, lowercased by ldapattr's 1) has a
    // counter too, and no file until it is written; x..y is passed over.
    let r = get(pp, origin.port(), Some(("carol", "carolpw")));
    assert_eq!(r.status, 200, "{r}");

    // At exit every member's file is written: alice's 60,000 and what her
    // first request brought in; carol's from 0.
    proxy.signal("TERM");
    assert!(proxy.wait_exit(Duration::from_secs(10)).is_some());
    let a = lc(&counts.join("alice.lc"));
    assert!(a[0] >= 100_000 && a[0] < 101_000, "{a:?}");
    assert!(a[1] >= now && a[2] >= now, "{a:?}");
    let c = lc(&counts.join("carol.lc"));
    assert!(c[0] >= 40_000 && c[0] < 41_000, "{c:?}");
    assert!(!counts.join("x..y.lc").exists());
    assert!(!counts.join("bob.lc").exists());
    assert_eq!(std::fs::read_dir(&counts).unwrap().count(), 2);
}

/// What `ldaptrafgroup` refuses, naming file, line and why: a period the
/// plugin leaves undefined, a rate it would divide by zero with, and a
/// directory that cannot be reached while the cfg loads.
#[test]
fn trafgroup_cfg_errors() {
    let dir = Dir::new("ldap_trafgroup_cfg");
    let cfg = dir.cfg_path();
    let ldap = Slapd::start(&dir);
    let lines = |server: &str, rest: &str| {
        format!(
            "plugin LdapPlugin.ld.so start\nldapconnect {server} {ADMIN} {ADMIN_PW}\n\
             ldapattr uid ou\nldapsbase {SUFFIX}\nldapdircount /tmp/\n{rest}\n"
        )
    };
    let server = format!("127.0.0.1:{}", ldap.port);
    let f = run_check(
        &dir,
        &lines(&server, "ldaptrafgroup traf HOURLY 1000 60000"),
    );
    let e = f.assert_cfg_error(&cfg, 6, "ldaptrafgroup");
    assert!(e.contains("MONTHLY, WEEKLY or DAILY"), "{e}");
    let f = run_check(
        &dir,
        &lines(&server, "ldaptrafgroup traf Monthly 1000 60000"),
    );
    f.assert_cfg_error(&cfg, 6, "ldaptrafgroup");
    let f = run_check(&dir, &lines(&server, "ldaptrafgroup traf daily 1000 0"));
    let e = f.assert_cfg_error(&cfg, 6, "ldaptrafgroup");
    assert!(e.contains("bits per second"), "{e}");
    let f = run_check(
        &dir,
        &lines(&server, "ldaptrafgroup traf weekly 1000 60000"),
    );
    assert!(f.status.success(), "{}", f.stderr);
    // A lenient number warns with the line, as C's atol reads it.
    let f = run_check(
        &dir,
        &lines(&server, "ldaptrafgroup traf weekly 1000k 60000"),
    );
    assert!(f.status.success(), "{}", f.stderr);
    assert!(
        f.stderr.contains(":6:") && f.stderr.contains("1000 used"),
        "{}",
        f.stderr
    );
    let down = format!("127.0.0.1:{}", free_port());
    let f = run_check(&dir, &lines(&down, "ldaptrafgroup traf weekly 1000 60000"));
    let e = f.assert_cfg_error(&cfg, 6, "ldaptrafgroup");
    assert!(e.contains("bind"), "{e}");
    let f = run_check(
        &dir,
        "plugin LdapPlugin.ld.so start\nldapconnect 127.0.0.1 cn=a\nldapattr uid ou\n\
         ldapsbase dc=x\nldaptrafgroup traf DAILY 1 300\n",
    );
    let e = f.assert_cfg_error(&cfg, 5, "ldaptrafgroup");
    assert!(e.contains("needs ldapdircount"), "{e}");
}
