//! `log &DSN,USER,PASSWORD`: the access log as SQL statements through
//! ODBC, against SQLite's ODBC driver (Debian's libsqliteodbc, with the
//! odbcinst.ini and odbc.ini each test writes into its temp dir and
//! names with ODBCSYSINI and ODBCINI). Rows arrive with the values of
//! HTTP and SOCKS sessions; quotes in a URL and a user name are stored
//! as text; a database that is away (locked by another process, or its
//! file and directory made unwritable for the proxy running as nobody)
//! while clients keep being served loses no more records than the queue
//! bound, and the drop count is logged; a reload during the outage keeps
//! the queued records; 3proxy's SQL sample lines work unchanged.

use std::io::{BufRead, BufReader};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use crate::util::*;

/// The SQLite ODBC driver Debian's libsqliteodbc installs.
const DRIVER: &str = "/usr/lib/x86_64-linux-gnu/odbc/libsqlite3odbc.so";
const PYTHON: &str = "/usr/bin/python3";
const FIELD: char = '\u{1f}';
/// How long a row may take: the writer's retry delay grows to 8 s while
/// the database is away.
const DB_WAIT: Duration = Duration::from_secs(30);

/// [`wait_for`] for a condition that runs python3: polled less often.
fn wait_db(mut cond: impl FnMut() -> bool) -> bool {
    wait_for(
        || {
            std::thread::sleep(Duration::from_millis(100));
            cond()
        },
        DB_WAIT,
    )
}

/// A SQLite database in the test's dir, a DSN `logdb` for it, and the
/// table `log`.
struct Db {
    file: PathBuf,
    env: Vec<(String, String)>,
}

impl Db {
    fn new(dir: &Dir) -> Db {
        Db::at(dir, dir.join("log.db"))
    }

    fn at(dir: &Dir, file: PathBuf) -> Db {
        Db::with_driver(dir, file, DRIVER)
    }

    /// `driver` is what odbcinst.ini says after `Driver=`.
    fn with_driver(dir: &Dir, file: PathBuf, driver: &str) -> Db {
        assert!(
            Path::new(DRIVER).exists(),
            "{DRIVER} missing: run tests/deps.sh (libsqliteodbc)"
        );
        dir.write(
            "odbcinst.ini",
            format!("[SQLite3]\nDescription=SQLite3 ODBC driver\nDriver={driver}\n"),
        );
        // Timeout: how long a statement waits for a lock (ms), so a
        // locked database fails a statement quickly.
        let ini = dir.write(
            "odbc.ini",
            format!(
                "[logdb]\nDriver=SQLite3\nDatabase={}\nTimeout=100\n",
                p(&file)
            ),
        );
        let db = Db {
            file,
            env: vec![
                (
                    "ODBCSYSINI".into(),
                    p(&dir.join("")).trim_end_matches('/').into(),
                ),
                ("ODBCINI".into(), p(&ini).into()),
            ],
        };
        db.sql(
            "create table log (service text, username text, url text, host text, \
             port integer, bytesin integer, bytesout integer, result text)",
        );
        db
    }

    fn envs(&self) -> Vec<(&str, &str)> {
        self.env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    /// Run one statement with python3's sqlite3; the rows, fields split.
    fn sql(&self, statement: &str) -> Vec<Vec<String>> {
        let out = Command::new(PYTHON)
            .args([
                "-c",
                "import sqlite3,sys\n\
                 c=sqlite3.connect(sys.argv[1], timeout=10)\n\
                 rows=c.execute(sys.argv[2]).fetchall()\n\
                 c.commit()\n\
                 for r in rows: print('\\x1f'.join(str(v) for v in r))",
                p(&self.file),
                statement,
            ])
            .output()
            .expect("run python3");
        assert!(
            out.status.success(),
            "sqlite3 {statement}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.split(FIELD).map(str::to_string).collect())
            .collect()
    }

    fn count(&self) -> usize {
        self.sql("select count(*) from log")[0][0].parse().unwrap()
    }

    /// Rows whose url contains `pat`, oldest first.
    fn urls_like(&self, pat: &str) -> Vec<String> {
        self.sql(&format!(
            "select url from log where url like '%{pat}%' order by rowid"
        ))
        .into_iter()
        .map(|mut r| r.remove(0))
        .collect()
    }

    /// Another process takes the database's exclusive lock: every
    /// statement of the proxy fails until [`Lock::release`].
    fn lock(&self) -> Lock {
        let mut child = Command::new(PYTHON)
            .args([
                "-c",
                "import sqlite3,sys\n\
                 c=sqlite3.connect(sys.argv[1], isolation_level=None)\n\
                 c.execute('begin exclusive')\n\
                 print('locked', flush=True)\n\
                 sys.stdin.read()\n\
                 c.execute('rollback')",
                p(&self.file),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run python3");
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "locked");
        Lock {
            child,
            stdin: Some(stdin),
            _out: out,
        }
    }
}

struct Lock {
    child: Child,
    stdin: Option<ChildStdin>,
    _out: BufReader<ChildStdout>,
}

impl Lock {
    fn release(mut self) {
        drop(self.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The logformat: every field a row has, from a quoted literal with
/// escapes (`'%N'`), a literal with two escapes, client text outside
/// quotes (`%T` on its own is not used: the URL is quoted) and numbers.
const LOGFORMAT: &str =
    "Linsert into log (service, username, url, host, port, bytesin, bytesout, result) \
     values ('%N', '%U', '%T', '%n', %r, %I, %O, 'E%E')";

fn cfg(body: &str) -> String {
    cfg_with("", body)
}

/// The cfg with `pre` before the `log &` line (settings it reads).
fn cfg_with(pre: &str, body: &str) -> String {
    format!(
        "{pre}log &logdb,root,secret\nlogformat \"{}\"\n{body}",
        LOGFORMAT.replace('"', "\"\"")
    )
}

/// An HTTP request through the proxy on `port`, with credentials;
/// the response.
fn http_get(port: u16, url: &str, auth: Option<&str>) -> String {
    let auth = auth
        .map(|a| format!("Proxy-Authorization: Basic {}\r\n", base64(a)))
        .unwrap_or_default();
    let request = format!("GET {url} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n");
    http_once(port, request.as_bytes()).to_string()
}

/// A SOCKS5 CONNECT with user/password to 127.0.0.1:`to`, then `msg`
/// echoed.
fn socks5_echo(port: u16, user: &str, pass: &str, to: u16, msg: &[u8]) {
    let mut s = socks5_connect(port, Some((user, pass)), localhost(to));
    echo_roundtrip(&mut s, msg);
    s.shutdown(Shutdown::Both).unwrap();
}

fn hello(path: &str) -> String {
    let body = format!("hello {path}");
    format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[test]
fn rows_arrive_for_http_and_socks_sessions() {
    let dir = Dir::new("sqllog_rows");
    let db = Db::new(&dir);
    let origin = crate::socks::http_origin("127.0.0.1:0");
    let echo = Origin::echo();
    let (hp, sp) = (free_port(), free_port());
    let body = format!(
        "users alice:CL:pw\nauth strong\nallow alice\n\
         proxy -i127.0.0.1 -p{hp}\nsocks -i127.0.0.1 -p{sp}\n"
    );
    let proxy = Proxy::start_with_env(
        dir,
        &cfg(&body),
        &[Listen::Tcp(localhost(hp)), Listen::Tcp(localhost(sp))],
        &db.envs(),
    );
    let url = format!("http://127.0.0.1:{}/first", origin.port());
    let resp = http_get(hp, &url, Some("alice:pw"));
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.ends_with(&hello("/first")), "{resp}");
    socks5_echo(sp, "alice", "pw", echo.port(), b"ping through socks");

    let alice = || db.sql("select count(*) from log where username = 'alice'")[0][0] == "2";
    assert!(
        wait_db(alice),
        "rows: {:?}\nstderr: {}",
        db.sql("select * from log"),
        proxy.stderr()
    );
    let rows = db.sql(
        "select service, username, url, host, port, bytesin, bytesout, result from log \
         where username = 'alice' order by rowid",
    );
    let http_in = resp.len().to_string();
    let op = origin.port().to_string();
    assert_eq!(
        rows[0],
        [
            "PROXY",
            "alice",
            &format!("GET {url} HTTP/1.1"),
            "127.0.0.1",
            &op,
            &http_in,
            &rows[0][6],
            "E00000"
        ]
    );
    assert!(
        rows[0][6].parse::<u64>().unwrap() > 0,
        "bytesout {:?}",
        rows[0]
    );
    let ep = echo.port().to_string();
    assert_eq!(rows[1][0], "SOCK5"); // 3proxy's name for it
    assert_eq!(rows[1][1], "alice");
    assert_eq!(rows[1][2], format!("CONNECT 127.0.0.1:{ep}"));
    assert_eq!(rows[1][3], "127.0.0.1");
    assert_eq!(rows[1][4], ep);
    assert_eq!(rows[1][5], "18"); // the echo
    assert_eq!(rows[1][6], "18");
    assert_eq!(rows[1][7], "E00000");
    assert_eq!(rows.len(), 2);
}

#[test]
fn quotes_in_a_url_and_a_user_name_are_stored_as_text() {
    let dir = Dir::new("sqllog_quotes");
    let db = Db::new(&dir);
    let origin = crate::socks::http_origin("127.0.0.1:0");
    let hp = free_port();
    let body = format!("users o'brien:CL:pw\nauth strong\nallow *\nproxy -i127.0.0.1 -p{hp}\n");
    let proxy = Proxy::start_with_env(dir, &cfg(&body), &[Listen::Tcp(localhost(hp))], &db.envs());
    // A path that would end the literal and the statement, if it were
    // pasted into it.
    let path = "/q'),('x','y','z','w',1,2,3,'E');drop%20table%20log;--";
    let url = format!("http://127.0.0.1:{}{path}", origin.port());
    let resp = http_get(hp, &url, Some("o'brien:pw"));
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.ends_with(&hello(path)), "{resp}");
    assert!(
        wait_db(|| !db.urls_like("drop").is_empty()),
        "no row for the request: {:?}\nstderr: {}",
        db.sql("select * from log"),
        proxy.stderr()
    );
    let rows = db.sql("select username, url from log where url like '%drop%'");
    assert_eq!(
        rows,
        [["o'brien".to_string(), format!("GET {url} HTTP/1.1")]]
    );
    // The table is intact and holds no row the URL spelled out: every
    // row is a record of the proxy (its start, the harness's readiness
    // probe, the request).
    assert!(
        db.sql("select url from log where service <> 'PROXY' or username = 'y'")
            .is_empty(),
        "{:?}",
        db.sql("select * from log")
    );
    assert!(db.count() >= 2);
}

/// The total of every "N records dropped" the proxy has logged.
fn dropped(stderr: &str) -> usize {
    stderr
        .lines()
        .filter_map(|l| {
            l.split(": ")
                .find_map(|f| f.strip_suffix(" records dropped"))
        })
        .map(|n| n.parse::<usize>().unwrap())
        .sum()
}

#[test]
fn database_away_clients_served_records_queued_up_to_the_bound() {
    const BOUND: usize = 5;
    const OUTAGE: usize = 14;
    let dir = Dir::new("sqllog_outage");
    let db = Db::new(&dir);
    let origin = crate::socks::http_origin("127.0.0.1:0");
    let hp = free_port();
    let body = format!("auth iponly\nallow *\nproxy -i127.0.0.1 -p{hp}\n");
    let proxy = Proxy::start_with_env(
        dir,
        &cfg_with(&format!("odbcqueue {BOUND}\n"), &body),
        &[Listen::Tcp(localhost(hp))],
        &db.envs(),
    );
    let get = |path: &str| {
        let url = format!("http://127.0.0.1:{}{path}", origin.port());
        let resp = http_get(hp, &url, None);
        assert!(resp.ends_with(&hello(path)), "{path}: {resp}");
    };
    get("/before");
    assert!(
        wait_db(|| db.urls_like("/before").len() == 1),
        "stderr: {}",
        proxy.stderr()
    );

    let lock = db.lock();
    for i in 0..OUTAGE {
        get(&format!("/away{i:02}"));
    }
    // BOUND records wait: the rest are dropped, and said so.
    assert!(
        wait_for(|| dropped(&proxy.stderr()) >= OUTAGE - BOUND, START_TIMEOUT),
        "no drop count logged:\n{}",
        proxy.stderr()
    );
    let stderr = proxy.stderr();
    assert!(stderr.contains("access log &logdb: "), "{stderr}");
    assert!(
        stderr.contains("records wait in memory (at most 5)"),
        "{stderr}"
    );
    lock.release();
    // Every record of the outage is either written or counted as dropped.
    assert!(
        wait_db(|| db.urls_like("/away").len() + dropped(&proxy.stderr()) == OUTAGE),
        "records lost without a count: {:?}\nstderr: {}",
        db.sql("select url from log"),
        proxy.stderr()
    );
    let stderr = proxy.stderr();
    let kept = db.urls_like("/away");
    // The first BOUND, in order: drops take the newest.
    let idx: Vec<usize> = kept
        .iter()
        .map(|u| u.split("/away").nth(1).unwrap()[..2].parse().unwrap())
        .collect();
    assert_eq!(idx, (0..BOUND).collect::<Vec<_>>(), "{kept:?}\n{stderr}");
    assert!(stderr.contains("takes records again"), "{stderr}");
    // And the log goes on as before.
    get("/after");
    assert!(
        wait_db(|| db.urls_like("/after").len() == 1),
        "no row after the database came back: {:?}\nstderr: {}",
        db.sql("select url from log"),
        proxy.stderr()
    );
    assert_eq!(dropped(&proxy.stderr()), OUTAGE - kept.len());
}

#[test]
fn a_reload_during_an_outage_keeps_the_queued_records() {
    let dir = Dir::new("sqllog_reload");
    let db = Db::new(&dir);
    let origin = crate::socks::http_origin("127.0.0.1:0");
    let (hp, hp2) = (free_port(), free_port());
    let body = format!("auth iponly\nallow *\nproxy -i127.0.0.1 -p{hp}\n");
    let mut proxy =
        Proxy::start_with_env(dir, &cfg(&body), &[Listen::Tcp(localhost(hp))], &db.envs());
    let get = |port: u16, path: &str| {
        let url = format!("http://127.0.0.1:{}{path}", origin.port());
        let resp = http_get(port, &url, None);
        assert!(resp.ends_with(&hello(path)), "{path}: {resp}");
    };
    get(hp, "/before");
    assert!(wait_db(|| db.urls_like("/before").len() == 1));

    let lock = db.lock();
    for i in 0..3 {
        get(hp, &format!("/old{i}"));
    }
    // The same target: the running writer, its queue and all, goes on.
    proxy.signal("USR1");
    let body2 = format!("{body}proxy -i127.0.0.1 -p{hp2}\n");
    proxy.dir.write("3proxy.cfg", cfg(&body2));
    proxy.signal("USR1");
    assert!(
        wait_for(|| TcpStream::connect(localhost(hp2)).is_ok(), START_TIMEOUT),
        "the reload did not happen: {}",
        proxy.stderr()
    );
    get(hp2, "/same0");
    // Another queue size: a new writer; the old one still writes its queue.
    let hp3 = free_port();
    let body3 = format!("{body2}proxy -i127.0.0.1 -p{hp3}\n");
    proxy
        .dir
        .write("3proxy.cfg", cfg_with("odbcqueue 50\n", &body3));
    proxy.signal("USR1");
    assert!(
        wait_for(|| TcpStream::connect(localhost(hp3)).is_ok(), START_TIMEOUT),
        "the reload did not happen: {}",
        proxy.stderr()
    );
    get(hp3, "/new0");
    lock.release();

    let want = ["/old0", "/old1", "/old2", "/same0", "/new0"];
    assert!(
        wait_db(|| want.iter().all(|w| db.urls_like(w).len() == 1)),
        "rows: {:?}\nstderr: {}",
        db.sql("select url from log"),
        proxy.stderr()
    );
    assert_eq!(dropped(&proxy.stderr()), 0, "{}", proxy.stderr());
    assert!(proxy.is_running());
}

#[test]
fn check_only_and_bad_lines() {
    let dir = Dir::new("sqllog_check");
    // `-t` opens nothing: no driver, no database needed.
    let f = run_check(&dir, "log &nosuchdsn,u,p\nproxy -p0\n");
    assert!(f.status.success(), "{}", f.stderr);
    let f = start_expect_fail(&dir, "log &,user\nproxy -p0\n");
    f.assert_cfg_error(&dir.cfg_path(), 1, "log");
    assert!(f.stderr.contains("data source"), "{}", f.stderr);
    let f = start_expect_fail(&dir, "odbcqueue 0\n");
    f.assert_cfg_error(&dir.cfg_path(), 1, "odbcqueue");
}

#[test]
fn serves_without_a_database_driver_and_logs_the_error() {
    // No odbc.ini names the DSN: connecting fails, clients are served.
    let dir = Dir::new("sqllog_nodsn");
    dir.write("odbcinst.ini", "");
    let ini = dir.write("odbc.ini", "");
    let origin = crate::socks::http_origin("127.0.0.1:0");
    let hp = free_port();
    let sysini = p(&dir.join("")).trim_end_matches('/').to_string();
    let ini = p(&ini).to_string();
    let proxy = Proxy::start_with_env(
        dir,
        &cfg(&format!("auth iponly\nallow *\nproxy -i127.0.0.1 -p{hp}\n")),
        &[Listen::Tcp(localhost(hp))],
        &[("ODBCSYSINI", &sysini), ("ODBCINI", &ini)],
    );
    let url = format!("http://127.0.0.1:{}/x", origin.port());
    let resp = http_get(hp, &url, None);
    assert!(resp.ends_with(&hello("/x")), "{resp}");
    assert!(
        wait_for(
            || proxy.stderr().contains("access log &logdb: ")
                && proxy.stderr().contains("records wait in memory"),
            Duration::from_secs(20)
        ),
        "{}",
        proxy.stderr()
    );
}

#[test]
fn the_sql_sample_cfg_lines_work_unchanged() {
    // 3proxy's cfg/sql/3proxy.cfg.sample: its log and logformat lines as
    // they are, on the table of its create.sql (in SQLite's words). Its
    // filter prefix turns the quote in the URL into `_`.
    let dir = Dir::new("sqllog_sample");
    let db = Db::new(&dir);
    db.sql(
        "create table sample (time datetime, bytesin int, bytesout int, username varchar(20), \
         service varchar(7), host varchar(100), port int, url varchar(255))",
    );
    let origin = crate::socks::http_origin("127.0.0.1:0");
    let hp = free_port();
    let cfg = format!(
        "log &logdb,root\n\
         logformat \"-\\'+_Linsert into sample (time, bytesin, bytesout, username, url, host, port, service) \
         values ('%Y-%m-%d %H:%M:%S', %I, %O, '%U', '%T', '%n', %r, '%N');\"\n\
         auth iponly\nallow *\nproxy -i127.0.0.1 -p{hp}\n"
    );
    let proxy = Proxy::start_with_env(dir, &cfg, &[Listen::Tcp(localhost(hp))], &db.envs());
    let path = "/it's";
    let url = format!("http://127.0.0.1:{}{path}", origin.port());
    let resp = http_get(hp, &url, None);
    assert!(resp.ends_with(&hello(path)), "{resp}");
    let q = "select username, url, host, port, service, length(time) from sample where url like '%it_s%'";
    assert!(
        wait_db(|| db.sql(q).len() == 1),
        "{:?}\n{}",
        db.sql("select * from sample"),
        proxy.stderr()
    );
    let op = origin.port().to_string();
    assert_eq!(
        db.sql(q)[0],
        [
            "-",
            &format!("GET http://127.0.0.1:{op}/it_s HTTP/1.1"),
            "127.0.0.1",
            &op,
            "PROXY",
            "19"
        ]
    );
}

#[test]
fn database_file_unwritable_then_restored() {
    use std::os::unix::fs::{chown, PermissionsExt};
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    };
    assert!(
        is_root(),
        "this test needs root (to run the proxy as nobody): CI runs as root"
    );
    // The proxy runs as nobody, so file modes bind it (root ignores them).
    let dir = Dir::new("sqllog_unwritable");
    let sub = dir.join("db");
    std::fs::create_dir(&sub).unwrap();
    let db = Db::at(&dir, sub.join("log.db"));
    chown(&sub, Some(65534), Some(65534)).unwrap();
    chown(&db.file, Some(65534), Some(65534)).unwrap();
    let origin = crate::socks::http_origin("127.0.0.1:0");
    let hp = free_port();
    let body =
        format!("setgid 65534\nsetuid 65534\nauth iponly\nallow *\nproxy -i127.0.0.1 -p{hp}\n");
    let proxy = Proxy::start_with_env(
        dir,
        &cfg_with("odbcqueue 4\n", &body),
        &[Listen::Tcp(localhost(hp))],
        &db.envs(),
    );
    let get = |path: &str| {
        let url = format!("http://127.0.0.1:{}{path}", origin.port());
        let resp = http_get(hp, &url, None);
        assert!(resp.ends_with(&hello(path)), "{path}: {resp}");
    };
    get("/before");
    assert!(
        wait_db(|| db.urls_like("/before").len() == 1),
        "{}",
        proxy.stderr()
    );
    // Unwritable: no journal can be made, the file opens read-only.
    mode(&db.file, 0o444);
    mode(&sub, 0o555);
    for i in 0..10 {
        get(&format!("/ro{i}"));
    }
    assert!(
        wait_for(|| dropped(&proxy.stderr()) >= 10 - 4, START_TIMEOUT),
        "no drop count logged:\n{}",
        proxy.stderr()
    );
    assert!(db.urls_like("/ro").is_empty(), "written while unwritable?");
    mode(&sub, 0o755);
    mode(&db.file, 0o644);
    assert!(
        wait_db(|| db.urls_like("/ro").len() + dropped(&proxy.stderr()) == 10),
        "records lost without a count: {:?}\n{}",
        db.sql("select url from log"),
        proxy.stderr()
    );
    let kept = db.urls_like("/ro");
    assert_eq!(kept.len(), 4, "{kept:?}\n{}", proxy.stderr());
    assert!(
        kept[0].contains("/ro0 ") && kept[3].contains("/ro3 "),
        "{kept:?}"
    );
    assert!(
        proxy.stderr().contains("takes records again"),
        "{}",
        proxy.stderr()
    );
}

fn is_root() -> bool {
    // The second id of the Uid: line is the effective one.
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|u| u.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false)
}

#[test]
fn records_queued_at_sigterm_are_written_before_exit() {
    let dir = Dir::new("sqllog_exit");
    let db = Db::new(&dir);
    let origin = crate::socks::http_origin("127.0.0.1:0");
    let hp = free_port();
    let body = format!("auth iponly\nallow *\nproxy -i127.0.0.1 -p{hp}\n");
    let mut proxy =
        Proxy::start_with_env(dir, &cfg(&body), &[Listen::Tcp(localhost(hp))], &db.envs());
    // Twenty clients at once, and the signal as soon as they are served:
    // the writer is still busy with their records.
    let op = origin.port();
    let clients: Vec<_> = (0..20)
        .map(|i| {
            std::thread::spawn(move || {
                let path = format!("/bye{i:02}");
                let url = format!("http://127.0.0.1:{op}{path}");
                assert!(http_get(hp, &url, None).ends_with(&hello(&path)));
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    proxy.signal("TERM");
    let status = proxy.wait_exit(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        proxy.stderr()
    );
    assert_eq!(db.urls_like("/bye").len(), 20, "{}", proxy.stderr());
}

#[test]
fn a_record_the_database_refuses_does_not_hold_up_the_others() {
    let dir = Dir::new("sqllog_refused");
    let db = Db::new(&dir);
    // The database refuses mallory's rows, and only those.
    db.sql("create trigger no_mallory before insert on log when new.username = 'mallory' begin select raise(abort, 'no mallory'); end");
    let origin = crate::socks::http_origin("127.0.0.1:0");
    let hp = free_port();
    let body = format!(
        "users alice:CL:pw mallory:CL:pw\nauth strong\nallow *\nproxy -i127.0.0.1 -p{hp}\n"
    );
    let proxy = Proxy::start_with_env(dir, &cfg(&body), &[Listen::Tcp(localhost(hp))], &db.envs());
    let get = |path: &str, who: &str| {
        let url = format!("http://127.0.0.1:{}{path}", origin.port());
        let resp = http_get(hp, &url, Some(who));
        assert!(resp.ends_with(&hello(path)), "{path}: {resp}");
    };
    // A run of refused records longer than one round's probes.
    for i in 0..4 {
        get(&format!("/m{i}"), "mallory:pw");
    }
    for i in 0..3 {
        get(&format!("/a{i}"), "alice:pw");
    }
    assert!(
        wait_db(|| db.urls_like("/a").len() == 3),
        "{:?}\n{}",
        db.sql("select url from log"),
        proxy.stderr()
    );
    assert!(db.urls_like("/m").is_empty());
    let stderr = proxy.stderr();
    assert!(
        stderr.contains("a record was refused and dropped") && stderr.contains("no mallory"),
        "{stderr}"
    );
    assert_eq!(dropped(&stderr), 0, "{stderr}");
}

#[test]
fn a_driver_named_without_a_directory_is_found() {
    // As Debian's libsqliteodbc writes it into /etc/odbcinst.ini: the
    // built-in driver manager finds it through the binary's RUNPATH.
    let dir = Dir::new("sqllog_bare_driver");
    let db = Db::with_driver(&dir, dir.join("log.db"), "libsqlite3odbc.so");
    let origin = crate::socks::http_origin("127.0.0.1:0");
    let hp = free_port();
    let body = format!("auth iponly\nallow *\nproxy -i127.0.0.1 -p{hp}\n");
    let proxy = Proxy::start_with_env(dir, &cfg(&body), &[Listen::Tcp(localhost(hp))], &db.envs());
    let url = format!("http://127.0.0.1:{}/bare", origin.port());
    assert!(http_get(hp, &url, None).ends_with(&hello("/bare")));
    assert!(
        wait_db(|| db.urls_like("/bare").len() == 1),
        "{}",
        proxy.stderr()
    );
}

#[test]
fn the_binary_needs_no_odbc_library_to_start() {
    // The driver manager is linked in: no libodbc among the libraries the
    // dynamic loader must find before main, so a host without unixODBC
    // starts and serves every cfg without `log &`.
    let out = Command::new("readelf")
        .args(["-d", BIN])
        .output()
        .expect("run readelf (binutils)");
    assert!(out.status.success());
    let dynamic = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert!(!needed.is_empty(), "{dynamic}");
    assert!(
        needed
            .iter()
            .all(|l| !l.contains("odbc") && !l.contains("ltdl")),
        "{needed:#?}"
    );
}
