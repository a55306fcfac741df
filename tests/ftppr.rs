//! `ftppr`, the FTP proxy: login through it to an FTP server the test
//! runs, PASV/EPSV/PORT with LIST, RETR and STOR relayed on data
//! connections, the FTP_DATA ACL check, commands before login, a
//! destination that refuses, and the log records.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use crate::util::*;

/// Service, code, client port, text, bytes out and in.
const FMT: &str = "L%N %E %c %T %O %I";
/// The service of these tests.
const FTPPR: Service = Service::tcp("ftppr", FMT);
const LISTING: &[u8] = b"-rw-r--r-- 1 ftp ftp 5000 Jan 1 00:00 file.bin\r\n";

/// The file RETR sends: 5000 bytes that are not all alike.
fn file() -> Vec<u8> {
    (0..5000u32).map(|i| (i * 7 % 251) as u8).collect()
}

/// What the FTP server saw: its control lines, and what STOR stored.
pub enum Seen {
    Line(String),
    Stored(Vec<u8>),
}

/// A tiny FTP server: greets 220, USER 331, PASS 230 (530 for "bad"),
/// PASV opens a data listener, LIST/RETR/STOR use it (150 then 226).
pub fn ftp_server() -> (Origin, Receiver<Seen>) {
    let (tx, rx) = channel();
    let origin = Origin::start("127.0.0.1:0", move |mut s: TcpStream| {
        let tx = tx.clone();
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        if s.write_all(b"220-test ftp\r\n220 ready\r\n").is_err() {
            return;
        }
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut data: Option<TcpListener> = None;
        let mut line = String::new();
        while matches!(r.read_line(&mut line), Ok(n) if n > 0) {
            let _ = tx.send(Seen::Line(line.clone()));
            let cmd = line.trim_end().to_string();
            line.clear();
            let verb = cmd.split(' ').next().unwrap_or("").to_ascii_uppercase();
            let reply: Vec<u8> = match verb.as_str() {
                "USER" => b"331 password please\r\n".to_vec(),
                "PASS" if cmd == "PASS bad" => b"530 wrong\r\n".to_vec(),
                "PASS" => b"230-welcome\r\n230 logged in\r\n".to_vec(),
                "PASV" => {
                    let l = TcpListener::bind("127.0.0.1:0").unwrap();
                    let p = l.local_addr().unwrap().port();
                    data = Some(l);
                    // An address other than its own: the proxy must use the
                    // control connection's.
                    format!("227 Entering (10,9,8,7,{},{})\r\n", p >> 8, p & 0xff).into_bytes()
                }
                "LIST" | "RETR" | "STOR" => {
                    let Some(l) = data.take() else {
                        let _ = s.write_all(b"425 no data\r\n");
                        continue;
                    };
                    let _ = s.write_all(b"150 opening\r\n");
                    let mut d = accept_within(&l, Duration::from_secs(10)).unwrap();
                    match verb.as_str() {
                        "LIST" => d.write_all(LISTING).unwrap(),
                        "RETR" => d.write_all(&file()).unwrap(),
                        _ => {
                            let mut got = Vec::new();
                            let _ = d.read_to_end(&mut got);
                            let _ = tx.send(Seen::Stored(got));
                        }
                    }
                    drop(d);
                    b"226 done\r\n".to_vec()
                }
                "QUIT" => b"221 bye\r\n".to_vec(),
                _ => b"500 what\r\n".to_vec(),
            };
            if s.write_all(&reply).is_err() || verb == "QUIT" {
                return;
            }
        }
    });
    (origin, rx)
}

/// The proxy's greeting.
const READY: &str = "220 Ready\r\n";

/// What an FTP client says beyond lines.
trait Ftp {
    /// USER and PASS through to the server at `o`.
    fn login(&mut self, o: u16);
    /// PASV: the port of the proxy's data listener, on 127.0.0.1.
    fn pasv(&mut self) -> u16;
}

impl Ftp for LineClient {
    fn login(&mut self, o: u16) {
        assert_eq!(self.cmd(&format!("USER bob@127.0.0.1:{o}")), "331 ok\r\n");
        assert_eq!(self.cmd("PASS secret"), "230-welcome\r\n");
        assert_eq!(self.line(), "230 logged in\r\n");
    }

    fn pasv(&mut self) -> u16 {
        let r = self.cmd("PASV");
        let inner = r
            .strip_prefix("227 OK (127,0,0,1,")
            .and_then(|x| x.strip_suffix(")\r\n"))
            .unwrap_or_else(|| panic!("{r:?}"));
        let n: Vec<u16> = inner.split(',').map(|x| x.parse().unwrap()).collect();
        (n[0] << 8) | n[1]
    }
}

fn lines(rx: &Receiver<Seen>) -> Vec<String> {
    let mut v = Vec::new();
    while let Ok(s) = rx.recv_timeout(Duration::from_millis(300)) {
        if let Seen::Line(l) = s {
            v.push(l);
        }
    }
    v
}

fn records_of(log: &std::path::Path, cport: u16, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    wait_for(
        || {
            got = log_lines(log)
                .into_iter()
                .filter(|l| l.split(' ').nth(2) == Some(&cport.to_string()))
                .collect();
            got.len() >= n
        },
        Duration::from_secs(10),
    );
    got
}

#[test]
fn ftppr_login_reaches_the_server_without_the_host() {
    let (origin, rx) = ftp_server();
    let (_proxy, port, log) = FTPPR.start("ftppr_login", "", "");
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    c.login(o);
    assert_eq!(c.cmd("SYST"), "500 what\r\n");
    assert_eq!(c.cmd("QUIT"), "221 bye\r\n");
    let cport = c.port();
    c.assert_closed();
    assert_eq!(
        lines(&rx),
        ["USER bob\r\n", "PASS secret\r\n", "SYST\r\n", "QUIT\r\n"]
    );
    // The login's record, then the session's end.
    let out = "USER bob\r\nPASS secret\r\n".len();
    let inb =
        "220-test ftp\r\n220 ready\r\n331 password please\r\n230-welcome\r\n230 logged in\r\n"
            .len();
    let recs = records_of(&log, cport, 2);
    assert_eq!(
        recs,
        [
            format!("FTPPR 00000 {cport} bob@127.0.0.1:{o} {out} {inb}"),
            format!(
                "FTPPR 00000 {cport}  {} {}",
                "SYST\r\nQUIT\r\n".len(),
                "500 what\r\n221 bye\r\n".len()
            ),
        ]
    );
}

#[test]
fn ftppr_pasv_list_and_retr() {
    let (origin, rx) = ftp_server();
    let (_proxy, port, log) = FTPPR.start("ftppr_retr", "", "");
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    c.login(o);
    let d = c.pasv();
    let mut data = connect(localhost(d));
    assert_eq!(c.cmd("LIST"), "125 data\r\n");
    let mut got = Vec::new();
    data.read_to_end(&mut got).unwrap();
    assert_eq!(got, LISTING);
    assert_eq!(c.line(), "226 done\r\n");
    // EPSV the same way.
    let r = c.cmd("EPSV");
    let d: u16 = r
        .strip_prefix("229 OK (|||")
        .and_then(|x| x.strip_suffix("|)\r\n"))
        .unwrap_or_else(|| panic!("{r:?}"))
        .parse()
        .unwrap();
    let mut data = connect(localhost(d));
    assert_eq!(c.cmd("RETR file.bin"), "125 data\r\n");
    let mut got = Vec::new();
    data.read_to_end(&mut got).unwrap();
    assert_eq!(got, file());
    assert_eq!(c.line(), "226 done\r\n");
    let cport = c.port();
    assert_eq!(c.cmd("QUIT"), "221 bye\r\n");
    c.assert_closed();
    let seen = lines(&rx);
    assert_eq!(
        &seen[2..],
        [
            "PASV\r\n",
            "LIST\r\n",
            "PASV\r\n",
            "RETR file.bin\r\n",
            "QUIT\r\n"
        ]
    );
    let recs = records_of(&log, cport, 4);
    assert_eq!(recs.len(), 4, "{recs:?}");
    // Each transfer's record: the command, and the data with the control
    // bytes of that exchange.
    let list = &recs[1];
    assert!(
        list.starts_with(&format!("FTPPR 00000 {cport} LIST ")),
        "{list}"
    );
    let inb: u64 = list.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(inb > LISTING.len() as u64, "{list}");
    let retr = &recs[2];
    assert!(
        retr.starts_with(&format!("FTPPR 00000 {cport} RETR file.bin ")),
        "{retr}"
    );
    let inb: u64 = retr.rsplit(' ').next().unwrap().parse().unwrap();
    // The server's 227, 150 and 226 lines besides the file.
    assert!((5000 + 40..5000 + 70).contains(&inb), "{retr}");
    let out: u64 = retr.split(' ').nth_back(1).unwrap().parse().unwrap();
    assert_eq!(out, ("PASV\r\n".len() + "RETR file.bin\r\n".len()) as u64);
}

#[test]
fn ftppr_stor_and_port() {
    let (origin, rx) = ftp_server();
    let (_proxy, port, log) = FTPPR.start("ftppr_stor", "", "");
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    c.login(o);
    // PORT: the proxy connects back to the client's address.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let lp = l.local_addr().unwrap().port();
    assert_eq!(
        c.cmd(&format!("PORT 127,0,0,1,{},{}", lp >> 8, lp & 0xff)),
        "200 OK\r\n"
    );
    let mut data = accept_within(&l, Duration::from_secs(10)).unwrap();
    let body: Vec<u8> = (0..3000u32).map(|i| (i % 200) as u8).collect();
    assert_eq!(c.cmd("STOR up.bin"), "125 data\r\n");
    data.write_all(&body).unwrap();
    drop(data);
    assert_eq!(c.line(), "226 done\r\n");
    let stored = loop {
        match rx.recv_timeout(Duration::from_secs(10)).expect("STOR") {
            Seen::Stored(b) => break b,
            Seen::Line(_) => {}
        }
    };
    assert_eq!(stored, body);
    let cport = c.port();
    assert_eq!(c.cmd("QUIT"), "221 bye\r\n");
    c.assert_closed();
    let recs = records_of(&log, cport, 3);
    let stor = &recs[1];
    assert!(
        stor.starts_with(&format!("FTPPR 00000 {cport} STOR up.bin ")),
        "{stor}"
    );
    let out: u64 = stor.split(' ').nth_back(1).unwrap().parse().unwrap();
    // The file, and the PASV and STOR commands sent to the server.
    assert_eq!(
        out,
        3000 + ("PASV\r\n".len() + "STOR up.bin\r\n".len()) as u64
    );
}

#[test]
fn ftppr_acl_refuses_the_data_connection() {
    let (origin, rx) = ftp_server();
    let (_proxy, port, _log) = FTPPR.start(
        "ftppr_acl",
        "auth iponly\ndeny * * * * FTP_DATA\nallow *\n",
        "",
    );
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    c.login(o);
    let d = c.pasv();
    let mut data = connect(localhost(d));
    assert_eq!(c.cmd("RETR file.bin"), "550 err\r\n");
    let mut got = Vec::new();
    let _ = data.read_to_end(&mut got);
    assert!(got.is_empty());
    assert_eq!(c.cmd("QUIT"), "221 bye\r\n");
    // The server was asked for PASV but never for the file.
    let seen = lines(&rx);
    assert!(seen.contains(&"PASV\r\n".to_string()), "{seen:?}");
    assert!(!seen.iter().any(|l| l.starts_with("RETR")), "{seen:?}");
}

#[test]
fn ftppr_nolog_session_writes_no_record_at_all() {
    // `nolog` covers the session: neither the login's record, nor a
    // transfer's, nor the end's.
    let (origin, _rx) = ftp_server();
    let (_proxy, port, log) = FTPPR.start(
        "ftppr_nolog",
        "auth iponly\nallow * * 127.0.0.1\nnolog\n",
        "",
    );
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    c.login(o);
    let d = c.pasv();
    let mut data = connect(localhost(d));
    assert_eq!(c.cmd("LIST"), "125 data\r\n");
    let mut got = Vec::new();
    data.read_to_end(&mut got).unwrap();
    assert_eq!(got, LISTING);
    assert_eq!(c.line(), "226 done\r\n");
    assert_eq!(c.cmd("QUIT"), "221 bye\r\n");
    c.assert_closed();
    // A second session, refused (no entry covers 127.0.0.2: 3), is logged:
    // once its record is there, the first one's would be too.
    let mut c = LineClient::connect(port, READY);
    c.s.write_all(format!("USER bob@127.0.0.2:{o}\r\n").as_bytes())
        .unwrap();
    let cport = c.port();
    c.assert_closed();
    expect_log_line(&log, &format!("FTPPR 00003 {cport}  0 0"));
    let recs = log_lines(&log);
    assert_eq!(
        recs.iter()
            .filter(|l| l.starts_with("FTPPR ") && !l.contains("Accepting"))
            .count(),
        1,
        "{recs:?}"
    );
}

#[test]
fn ftppr_acl_refuses_the_destination() {
    let (origin, _rx) = ftp_server();
    let o = origin.port();
    let (_proxy, port, log) = FTPPR.start(
        "ftppr_acl_dest",
        &format!("auth iponly\ndeny * * 127.0.0.1 {o}\nallow *\n"),
        "",
    );
    let mut c = LineClient::connect(port, READY);
    c.s.write_all(format!("USER bob@127.0.0.1:{o}\r\n").as_bytes())
        .unwrap();
    let cport = c.port();
    c.assert_closed();
    expect_log_line(&log, &format!("FTPPR 00001 {cport}  0 0"));
    assert!(origin.peers().is_empty(), "the server was reached");
}

#[test]
fn ftppr_commands_before_login() {
    let (_proxy, port, log) = FTPPR.start("ftppr_before_login", "", "");
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.cmd("LIST"), "530 login\r\n");
    assert_eq!(c.cmd("PASV"), "530 login\r\n");
    assert_eq!(c.cmd("PASS x"), "530 login\r\n");
    // Too short to be a command: the session ends.
    c.s.write_all(b"X\r\n").unwrap();
    let cport = c.port();
    c.assert_closed();
    expect_log_line(&log, &format!("FTPPR 00802 {cport}  0 0"));
    // A login without a host.
    let mut c = LineClient::connect(port, READY);
    c.s.write_all(b"USER bob\r\n").unwrap();
    let cport = c.port();
    c.assert_closed();
    expect_log_line(&log, &format!("FTPPR 00804 {cport}  0 0"));
}

#[test]
fn ftppr_destination_refusing_the_connection() {
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let o = closed.local_addr().unwrap().port();
    drop(closed);
    let (_proxy, port, log) = FTPPR.start("ftppr_refused", "", "");
    let mut c = LineClient::connect(port, READY);
    c.s.write_all(format!("USER bob@127.0.0.1:{o}\r\n").as_bytes())
        .unwrap();
    let cport = c.port();
    c.assert_closed();
    expect_log_line(&log, &format!("FTPPR 00013 {cport}  0 0"));
}

#[test]
fn ftppr_server_refusing_the_password() {
    let (origin, _rx) = ftp_server();
    let (_proxy, port, log) = FTPPR.start("ftppr_bad_pass", "", "");
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    assert_eq!(c.cmd(&format!("USER bob@127.0.0.1:{o}")), "331 ok\r\n");
    assert_eq!(c.cmd("PASS bad"), "530 wrong\r\n");
    let cport = c.port();
    // Not logged in: no data commands.
    assert_eq!(c.cmd("PASV"), "530 login\r\n");
    let recs = records_of(&log, cport, 1);
    assert!(
        recs[0].starts_with(&format!("FTPPR 00700 {cport} bob@127.0.0.1:{o} ")),
        "{recs:?}"
    );
}

/// `data` with each `from` replaced by `to` (same length).
fn replaced(data: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            i += from.len();
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn ftppr_pcre_denies_a_transfer_command() {
    let (origin, rx) = ftp_server();
    let (_proxy, port, log) = FTPPR.start(
        "ftppr_pcre_cmd",
        "pcre cliheader deny \"RETR secret\"\n",
        "",
    );
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    c.login(o);
    // A command no filter matches goes through as before.
    let d = c.pasv();
    let mut data = connect(localhost(d));
    assert_eq!(c.cmd("LIST"), "125 data\r\n");
    let mut got = Vec::new();
    data.read_to_end(&mut got).unwrap();
    assert_eq!(got, LISTING);
    assert_eq!(c.line(), "226 done\r\n");
    // The denied one: no reply, the connection closed, logged 880.
    let _d = c.pasv();
    let cport = c.port();
    c.s.write_all(b"RETR secret.txt\r\n").unwrap();
    c.assert_closed();
    let seen = lines(&rx);
    assert!(!seen.iter().any(|l| l.contains("secret.txt")), "{seen:?}");
    let recs = records_of(&log, cport, 2);
    assert!(
        recs.last()
            .unwrap()
            .starts_with(&format!("FTPPR 00880 {cport} ")),
        "{recs:?}"
    );
}

#[test]
fn ftppr_pcre_denies_the_login() {
    let (origin, rx) = ftp_server();
    let (_proxy, port, log) = FTPPR.start("ftppr_pcre_login", "pcre request deny \"^bob@\"\n", "");
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    // As in 3proxy, the server's answer is passed on before the check.
    c.login(o);
    let cport = c.port();
    c.s.write_all(b"SYST\r\n").unwrap();
    c.assert_closed();
    assert_eq!(lines(&rx), ["USER bob\r\n", "PASS secret\r\n"]);
    let recs = records_of(&log, cport, 1);
    assert_eq!(
        recs,
        [format!(
            "FTPPR 00877 {cport} bob@127.0.0.1:{o} {} {}",
            "USER bob\r\nPASS secret\r\n".len(),
            "220-test ftp\r\n220 ready\r\n331 password please\r\n230-welcome\r\n230 logged in\r\n"
                .len()
        )]
    );
}

#[test]
fn ftppr_pcre_rewrites_a_retr_file() {
    let (origin, _rx) = ftp_server();
    // The file has the bytes "AHOV" every 251 bytes; the listing has not.
    let (_proxy, port, _log) = FTPPR.start(
        "ftppr_pcre_rewrite",
        "pcre_rewrite srvdata dunno AHOV XYZW\n",
        "",
    );
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    c.login(o);
    let d = c.pasv();
    let mut data = connect(localhost(d));
    assert_eq!(c.cmd("RETR file.bin"), "125 data\r\n");
    let mut got = Vec::new();
    data.read_to_end(&mut got).unwrap();
    let want = replaced(&file(), b"AHOV", b"XYZW");
    assert_ne!(want, file());
    assert_eq!(got, want);
    assert_eq!(c.line(), "226 done\r\n");
    let d = c.pasv();
    let mut data = connect(localhost(d));
    assert_eq!(c.cmd("LIST"), "125 data\r\n");
    let mut got = Vec::new();
    data.read_to_end(&mut got).unwrap();
    assert_eq!(got, LISTING);
    assert_eq!(c.line(), "226 done\r\n");
    assert_eq!(c.cmd("QUIT"), "221 bye\r\n");
}

#[test]
fn ftppr_pcre_denies_a_word_in_a_retr_file() {
    let (origin, _rx) = ftp_server();
    let (_proxy, port, log) = FTPPR.start("ftppr_pcre_data", "pcre srvdata deny AHOV\n", "");
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    c.login(o);
    let d = c.pasv();
    let mut data = connect(localhost(d));
    assert_eq!(c.cmd("RETR file.bin"), "125 data\r\n");
    let mut got = Vec::new();
    let _ = data.read_to_end(&mut got);
    // The data connection is cut before the word; the session goes on.
    assert!(got.len() < file().len(), "{}", got.len());
    assert!(!got.windows(4).any(|w| w == b"AHOV"));
    assert!(file().starts_with(&got));
    assert_eq!(c.line(), "226 done\r\n");
    let cport = c.port();
    assert_eq!(c.cmd("QUIT"), "221 bye\r\n");
    let recs = records_of(&log, cport, 2);
    assert!(
        recs[1].starts_with(&format!("FTPPR 00019 {cport} RETR file.bin ")),
        "{recs:?}"
    );
}

#[test]
fn ftppr_pcre_rewrites_port_stor_and_the_stored_file() {
    let (origin, rx) = ftp_server();
    let (_proxy, port, _log) = FTPPR.start(
        "ftppr_pcre_stor",
        "pcre_rewrite srvheader dunno \"^200 OK\" \"200 Fine\"\n\
         pcre_rewrite cliheader dunno \"^STOR up\" \"STOR down\"\n\
         pcre_rewrite clidata dunno ABC abc\n",
        "",
    );
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    c.login(o);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let lp = l.local_addr().unwrap().port();
    assert_eq!(
        c.cmd(&format!("PORT 127,0,0,1,{},{}", lp >> 8, lp & 0xff)),
        "200 Fine\r\n"
    );
    let mut data = accept_within(&l, Duration::from_secs(10)).unwrap();
    let body: Vec<u8> = (0..3000u32).map(|i| (i % 200) as u8).collect();
    assert_eq!(c.cmd("STOR up.bin"), "125 data\r\n");
    data.write_all(&body).unwrap();
    drop(data);
    assert_eq!(c.line(), "226 done\r\n");
    let mut seen = Vec::new();
    let stored = loop {
        match rx.recv_timeout(Duration::from_secs(10)).expect("STOR") {
            Seen::Stored(b) => break b,
            Seen::Line(l) => seen.push(l),
        }
    };
    assert_eq!(seen.last().map(String::as_str), Some("STOR down.bin\r\n"));
    let want = replaced(&body, b"ABC", b"abc");
    assert_ne!(want, body);
    assert_eq!(stored, want);
    assert_eq!(c.cmd("QUIT"), "221 bye\r\n");
}

#[test]
fn ftppr_pcre_denies_epsv() {
    let (origin, _rx) = ftp_server();
    let (_proxy, port, log) = FTPPR.start("ftppr_pcre_epsv", "pcre cliheader deny ^EPSV\n", "");
    let o = origin.port();
    let mut c = LineClient::connect(port, READY);
    c.login(o);
    let _ = c.pasv();
    let cport = c.port();
    c.s.write_all(b"EPSV\r\n").unwrap();
    c.assert_closed();
    let recs = records_of(&log, cport, 2);
    assert!(
        recs.last()
            .unwrap()
            .starts_with(&format!("FTPPR 00878 {cport} ")),
        "{recs:?}"
    );
}

/// vsftpd serving `root` anonymously over implicit FTPS (TLS from the
/// first byte, as on port 990) with `pki`'s certificate, data connections
/// allowed in clear; killed when dropped.
struct Ftps(std::process::Child, u16);

impl Drop for Ftps {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ftps_server(dir: &Dir, pki: &crate::tls::Pki) -> Ftps {
    let root = dir.join("ftproot");
    let empty = dir.join("empty");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(root.join("file.bin"), file()).unwrap();
    let port = free_port();
    let conf = dir.write(
        "vsftpd.conf",
        format!(
            "listen=YES\nlisten_address=127.0.0.1\nlisten_port={port}\nbackground=NO\n\
             anonymous_enable=YES\nanon_root={}\nno_anon_password=YES\nlocal_enable=NO\n\
             write_enable=NO\nsecure_chroot_dir={}\nftp_username=daemon\n\
             ssl_enable=YES\nimplicit_ssl=YES\nallow_anon_ssl=YES\n\
             force_anon_logins_ssl=YES\nforce_anon_data_ssl=NO\nrequire_ssl_reuse=NO\n\
             rsa_cert_file={}\nrsa_private_key_file={}\npasv_enable=YES\n\
             seccomp_sandbox=NO\n",
            root.display(),
            empty.display(),
            pki.cert.display(),
            pki.key.display()
        ),
    );
    let child = std::process::Command::new("/usr/sbin/vsftpd")
        .arg(&conf)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("vsftpd (tests/deps.sh installs it)");
    let s = Ftps(child, port);
    assert!(
        wait_for(
            || std::net::TcpStream::connect(localhost(port)).is_ok(),
            START_TIMEOUT
        ),
        "vsftpd did not listen on {port}"
    );
    s
}

#[test]
fn ftppr_with_ssl_cli_logs_in_to_an_implicit_ftps_server_and_fetches_in_clear() {
    // The client speaks plain FTP to ftppr; ftppr's control connection to
    // vsftpd is TLS from its first byte (checked against the test CA),
    // the data connection in clear, as 3proxy's.
    let dir = Dir::new("ftppr_ftps");
    let pki = crate::tls::Pki::new(&dir);
    let ftps = ftps_server(&dir, &pki);
    let port = free_port();
    let log = dir.join("access.log");
    let cfg = format!(
        "log {}\nlogformat \"L%N %E %T\"\nssl_client_verify\nssl_client_ca_file {}\n\
         ssl_cli\nftppr -i127.0.0.1 -p{port}\n",
        log.display(),
        pki.ca.display()
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let mut c = LineClient::connect(port, READY);
    let r = c.cmd(&format!("USER anonymous@localhost:{}", ftps.1));
    assert!(r.starts_with("331 "), "{r:?}");
    let r = c.cmd("PASS x");
    assert!(r.starts_with("230 "), "{r:?}");
    let r = c.cmd("TYPE I");
    assert!(r.starts_with("200 "), "{r:?}");
    let d = c.pasv();
    let mut data = connect(localhost(d));
    // ftppr's own words for the transfer, as in the tests above.
    assert_eq!(c.cmd("RETR file.bin"), "125 data\r\n");
    let mut got = Vec::new();
    data.read_to_end(&mut got).unwrap();
    assert_eq!(got, file());
    let r = c.line();
    assert!(r.starts_with("226 "), "{r:?}");
    assert!(c.cmd("QUIT").starts_with("221 "));
    c.assert_closed();
    // Without ssl_cli the same server answers nothing ftppr can read (it
    // waits for a TLS ClientHello): no login.
    let dir = Dir::new("ftppr_ftps_plain");
    let port = free_port();
    let _plain = Proxy::start(
        dir,
        &format!("ftppr -i127.0.0.1 -p{port}\n"),
        &[Listen::Tcp(localhost(port))],
    );
    let mut c = LineClient::connect(port, READY);
    assert_eq!(
        c.cmd(&format!("USER anonymous@localhost:{}", ftps.1)),
        "331 ok\r\n"
    );
    let r = c.s.write_all(b"PASS x\r\n");
    assert!(r.is_ok());
    let mut rest = Vec::new();
    let _ = c.s.read_to_end(&mut rest);
    assert!(!String::from_utf8_lossy(&rest).contains("230"), "{rest:?}");
}

#[test]
fn the_ftp_gateway_with_ssl_cli_fetches_from_an_implicit_ftps_server() {
    // proxy's ftp:// gateway takes ssl_cli as ftppr does: the control
    // connection TLS from its first byte, the data in clear.
    let dir = Dir::new("ftpgw_ftps");
    let pki = crate::tls::Pki::new(&dir);
    let ftps = ftps_server(&dir, &pki);
    let port = free_port();
    let cfg = format!(
        "ssl_client_verify\nssl_client_ca_file {}\nssl_cli\nproxy -i127.0.0.1 -p{port}\n",
        pki.ca.display()
    );
    let _proxy = Proxy::start(dir, &cfg, &[Listen::Tcp(localhost(port))]);
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "20",
            "-x",
            &format!("http://127.0.0.1:{port}"),
        ])
        .arg(format!("ftp://anonymous:x@localhost:{}/file.bin", ftps.1))
        .output()
        .expect("run curl (tests/deps.sh installs it)");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, file());
}
