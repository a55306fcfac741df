//! `ftppr`: the FTP proxy (3proxy's ftppr.c with its ftp.c helpers). The
//! client is greeted `220 Ready` and logs in with `USER name@host[:port]`
//! (split at the last `delimchar`, port 21 by default; `OPEN host` first
//! and a plain `USER name` works too) and `PASS`; the proxy connects at
//! USER (op CONNECT), answers `331 ok`, and at PASS logs in to the server
//! itself, passing the server's final answer on.
//!
//! After login, PASV, EPSV and PORT are answered by the proxy: it listens
//! on the address the client reached it at (PASV, EPSV) or connects back
//! to the client's address (PORT). RETR, LIST, NLST, MLSD, STOR and APPE
//! then make the proxy send PASV to the server, connect to the port it
//! names at the control connection's server address (checked as op
//! FTP_DATA, as 3proxy does), send the command, tell the client
//! `125 data` and relay the data connection; a refusal is told
//! `550 err`. Every other command goes to the server as it is.
//!
//! A record is written after each PASS, CWD or data command that moved
//! bytes (`%T` `name@host[:port]`, or the command), and at the end.
//! `pcre` filters run where 3proxy's do: `request` on the login text
//! after PASS, `cliheader` on PASV/EPSV/PORT and the transfer commands,
//! `srvheader` on the proxy's answer to PASV/EPSV/PORT (a deny closes the
//! connection, 877-880), and `clidata`/`srvdata` on the data connections
//! (a deny cuts the transfer, 19).
//! Result codes are 3proxy's: 700-706 the server login failed, 801 the
//! greeting could not be sent, 802 a short command, 803/804 a bad host or
//! login, 821-829 the client's data connection, 834 no answer after a
//! transfer.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::access::{self, Op, Request};
use crate::chain;
use crate::client::Client;
use crate::filter::{self, Verdict};
use crate::net::Stream;
use crate::parent;
use crate::proto::ftp::{
    epsv_reply, is_final, parse_login, pasv_port, pasv_reply, port_arg, DEFAULT_PORT,
};
use crate::proto::mail::{parse_host, text, Lines, Login};
use crate::proto::starts_ci;
use crate::relay::{DataFilter, Hooks, RelayOpts};
use crate::res::Res;
use crate::resolve::resolve;
use crate::timeouts::Timeouts;

/// The longest line read (3proxy's buffer less its slack).
const LINE: usize = 2038;

/// What a `pcre` filter's ACE is matched against in this session
/// (`host` is the login's host, normalized).
fn filter_query<'a>(
    c: &'a Client,
    fs: &filter::Filters,
    host: &'a str,
    op: Op,
) -> crate::acl::Query<'a> {
    let (wday, daysec) = if fs.timed() {
        access::local_clock(std::time::SystemTime::now())
    } else {
        (0, 0)
    };
    crate::acl::Query {
        wday,
        daysec,
        user: c.user.as_deref(),
        src: c.client_addr.map(|a| a.ip()),
        dst: c.req_addr.map(|a| a.ip()),
        host: (!host.is_empty()).then_some(host),
        port: c.req_addr.map_or(0, |a| a.port()),
        op: op.bits(),
        ..Default::default()
    }
}

/// Run the service's filters of `kind` on `buf` (a command line without
/// its CRLF, or a reply the proxy makes), as 3proxy's ftppr does: Err(deny)
/// if one refuses it; a rewrite changes `buf`.
fn run_filters(c: &Client, kind: u8, op: Op, buf: &mut Vec<u8>, deny: Res) -> Result<(), Res> {
    let svc = c.svc();
    let Some(fs) = svc.filters.as_deref().filter(|f| f.has(kind)) else {
        return Ok(());
    };
    let host = c
        .req_host
        .as_deref()
        .map(crate::acl::normalize_host)
        .unwrap_or_default();
    let q = filter_query(c, fs, &host, op);
    match fs.check(kind, &q, buf) {
        Verdict::Pass => Ok(()),
        Verdict::Deny => Err(deny),
    }
}

/// The client's data connection as PASV/EPSV or PORT prepared it.
enum Data {
    None,
    Listening(TcpListener),
    Connected(Stream),
}

struct State {
    status: u8,
    srv: Option<Stream>,
    rd: Lines,
    login: Option<Login>,
    weight: u32,
    limits: Option<std::sync::Arc<crate::limit::SessionLimits>>,
    data: Data,
    req: Option<String>,
    /// The destination chosen by the handler that handed the client over
    /// (`parent ftp 0.0.0.0 0`): where a login without a host goes.
    known: Option<parent::Known>,
}

/// `parent ftp 0.0.0.0 0` in another service's ACL: greet the client as
/// ftppr does (`early`, what it sent before, is read first); a `USER`
/// without a host logs in at the destination the first handler chose
/// (3proxy's parseconnusername with a host known). The ACL is checked
/// again with the entries that redirect locally skipped.
/// [`serve`] runs it too, with nothing read early and no destination.
pub fn serve(c: &mut Client, early: &[u8], known: Option<&parent::Known>) -> parent::Next {
    let mut st = State {
        status: 0,
        srv: None,
        rd: Lines::default(),
        login: None,
        weight: 0,
        limits: None,
        data: Data::None,
        req: None,
        known: known.cloned(),
    };
    let res = run(c, &mut st, early).err().unwrap_or(Res::OK);
    c.record.res = res;
    c.record.bytes_in += std::mem::take(&mut st.rd.total);
    if let Some(s) = st.srv.take() {
        c.srv = Some(s);
    }
    if c.record.res != Res::OK || c.record.bytes_in != 0 || c.record.bytes_out != 0 {
        c.record.text = if c.record.res > Res::FTP_SHORT_COMMAND {
            st.req.take().unwrap_or_default()
        } else {
            String::new()
        };
        c.end_record();
    } else {
        c.drop_record();
    }
    c.next()
}

/// Write to the client, `err` if it fails.
fn tell(c: &Client, msg: &[u8], err: Res) -> Result<(), Res> {
    (&c.cli).write_all(msg).map_err(|_| err)
}

/// Send a command line to the server, counted.
fn send(c: &mut Client, st: &State, line: &[u8], err: Res) -> Result<(), Res> {
    let srv = st.srv.as_ref().ok_or(err)?;
    srv.set_timeout(Some(c.svc().timeouts.get(Timeouts::STRING_SHORT)))
        .map_err(|_| err)?;
    let mut w = srv;
    w.write_all(line).map_err(|_| err)?;
    c.record.bytes_out += line.len() as u64;
    Ok(())
}

/// One line from the server (empty when there is no server).
fn srv_line(c: &Client, st: &mut State) -> Vec<u8> {
    let wait = c.svc().timeouts.get(Timeouts::STRING_LONG);
    match &st.srv {
        Some(s) => st.rd.line(s, LINE, wait),
        None => Vec::new(),
    }
}

/// The last line of the server's next reply (continuation lines skipped).
fn srv_reply(c: &Client, st: &mut State) -> Vec<u8> {
    loop {
        let l = srv_line(c, st);
        if l.len() < 3 || is_final(&l) {
            return l;
        }
    }
}

fn run(c: &mut Client, st: &mut State, early: &[u8]) -> Result<(), Res> {
    let svc = c.svc().clone();
    let _ = c
        .cli
        .set_timeout(Some(svc.timeouts.get(Timeouts::STRING_SHORT)));
    tell(c, b"220 Ready\r\n", Res::FTP_GREET_SEND)?;
    let mut from_cli = Lines::with(early);
    loop {
        let line = from_cli.line(&c.cli, LINE, svc.timeouts.get(Timeouts::CONNECTION_SHORT));
        if line.is_empty() {
            return Ok(());
        }
        if line.len() < 4 {
            return Err(Res::FTP_SHORT_COMMAND);
        }
        let end = line
            .iter()
            .position(|&b| b == b'\r' || b == b'\n')
            .unwrap_or(line.len());
        let line = &line[..end];
        st.req = None;
        command(c, st, line)?;
        c.record.bytes_in += std::mem::take(&mut st.rd.total);
        if st.req.is_some() && (c.record.bytes_in != 0 || c.record.bytes_out != 0) {
            c.record.text = st.req.clone().unwrap_or_default();
            c.end_record();
        }
    }
}

fn command(c: &mut Client, st: &mut State, line: &[u8]) -> Result<(), Res> {
    let svc = c.svc().clone();
    let creds = svc.opts.needuser.unwrap_or(1) > 0;
    if starts_ci(line, b"OPEN ") {
        let (host, port) = parse_host(&line[5..], DEFAULT_PORT).ok_or(Res::FTP_BAD_HOST)?;
        st.srv = None;
        let l = Login {
            host,
            port,
            ..Login::default()
        };
        open(c, st, l)?;
        tell(c, b"220 Ready\r\n", Res::FTP_GREET_SEND)?;
        st.status = 1;
    } else if starts_ci(line, b"USER ") {
        let known = match (&st.login, st.status, &st.known) {
            (Some(l), 1, _) => Some((l.host.clone(), l.port)),
            (_, _, Some(k)) => Some((k.host(), k.addr.port())),
            _ => super::login::h_option(&svc.opts.other, DEFAULT_PORT),
        };
        let host = known.as_ref().map(|(h, p)| (h.as_str(), *p));
        let l = parse_login(&line[5..], svc.delimchar, creds, host).ok_or(Res::FTP_BAD_LOGIN)?;
        if st.status == 0 {
            open(c, st, l)?;
        } else if let Some(old) = &mut st.login {
            old.name = l.name;
            old.password.clone_from(&l.password);
        }
        tell(c, b"331 ok\r\n", Res::FTP_LOGIN_TELL)?;
        st.status = 2;
    } else if starts_ci(line, b"PASS ") && st.status >= 2 {
        let (res, reply) = login(c, st, &line[5..]);
        if !reply.is_empty() {
            tell(c, &reply, Res::FTP_LOGIN_TELL)?;
        }
        c.record.res = res;
        if res == Res::OK {
            st.status = 3;
        }
        if let Some(l) = &st.login {
            let t = super::login::login_text(&l.name, &l.host, l.port, DEFAULT_PORT);
            st.req = Some(t.clone());
            // 3proxy runs the `request` filters on this text once the
            // server has answered the login.
            run_filters(
                c,
                filter::REQUEST,
                Op::Connect,
                &mut t.into_bytes(),
                Res::FTP_FILTER_LOGIN,
            )?;
        }
    } else if st.status >= 3
        && (starts_ci(line, b"PASV") || starts_ci(line, b"EPSV") || starts_ci(line, b"PORT "))
    {
        st.data = Data::None;
        let mut cmd = line.to_vec();
        run_filters(
            c,
            filter::CLIHEADER,
            Op::Connect,
            &mut cmd,
            Res::FTP_FILTER_DATA_COMMAND,
        )?;
        let mut reply = prepare_data(c, st, &cmd)?.into_bytes();
        run_filters(
            c,
            filter::SRVHEADER,
            Op::Connect,
            &mut reply,
            Res::FTP_FILTER_DATA_ANSWER,
        )?;
        tell(c, &reply, Res::FTP_DATA_TELL)?;
        st.status = 4;
    } else if st.status == 4
        && [
            &b"RETR "[..],
            b"LIST",
            b"NLST ",
            b"MLSD",
            b"APPE ",
            b"STOR ",
        ]
        .iter()
        .any(|w| starts_ci(line, w))
    {
        transfer(c, st, line)?;
    } else if st.status < 3 {
        tell(c, b"530 login\r\n", Res::FTP_NOT_LOGGED_TELL)?;
    } else {
        let quit = starts_ci(line, b"QUIT");
        if starts_ci(line, b"CWD ") {
            st.req = Some(text(line));
        }
        let mut l = line.to_vec();
        l.extend_from_slice(b"\r\n");
        send(c, st, &l, Res::FTP_COMMAND_SEND)?;
        let mut last;
        loop {
            last = srv_line(c, st);
            if last.is_empty() {
                break;
            }
            tell(c, &last, Res::FTP_ANSWER_TELL)?;
            if last.len() > 4 && is_final(&last) {
                break;
            }
        }
        if quit {
            return Err(Res::OK);
        }
        if last.len() < 3 {
            return Err(Res::FTP_NO_ANSWER);
        }
    }
    Ok(())
}

/// Check the login (op CONNECT) and connect to its host.
fn open(c: &mut Client, st: &mut State, l: Login) -> Result<(), Res> {
    let svc = c.svc().clone();
    c.req_host = Some(l.host.clone());
    if l.user.is_some() {
        c.user.clone_from(&l.user);
    }
    let l = st.login.insert(l);
    let dst = match &st.known {
        Some(k) if k.addr.port() == l.port && k.host() == l.host => k.addr,
        _ => resolve(&l.host, l.port, svc.family).map_err(|_| Res::FTP_BAD_HOST)?,
    };
    c.req_addr = Some(dst);
    let req = Request {
        host: Some(&l.host),
        addr: Some(dst.ip()),
        port: l.port,
        user: l.user.as_deref(),
        password: l.password.as_deref(),
        ..c.request(Op::Connect)
    };
    // The login is in: busy from here.
    c.live.busy();
    let grant = access::authorize(&svc, &req)?;
    crate::session::keep(c, &grant);
    if crate::net::Addr::Ip(dst) == svc.listen || Some(dst) == c.local_addr {
        return Err(Res::LOOP);
    }
    st.weight = grant.weight;
    let (mut s, hops, peer) = connect(c, dst, Some(&l.host), l, &grant.parents)?;
    c.hops = c.local_hops + hops;
    // Straight to the server: the address connected to (the other
    // family's after happy eyeballs).
    c.remote_addr = peer.or_else(|| s.peer_addr());
    c.ext_addr = s.local_addr();
    c.record.ops.connects += 1;
    // `ssl_cli` (modes 0 and 1): the control connection is TLS from its
    // first byte (implicit FTPS, port 990); the data connections stay in
    // clear, as 3proxy leaves them, for servers that allow that.
    crate::session::tls_to_dest(c, &mut s, &l.host, crate::session::DestAt::Reached, false)?;
    st.limits = grant.limits;
    st.rd = Lines::default();
    st.srv = Some(s);
    Ok(())
}

fn connect(
    c: &Client,
    dst: SocketAddr,
    host: Option<&str>,
    l: &Login,
    parents: &[parent::Hop],
) -> Result<(Stream, u32, Option<SocketAddr>), Res> {
    let svc = c.svc().clone();
    let want = chain::Want {
        addr: Some(dst),
        host,
        user: l.user.as_deref(),
        password: l.password.as_deref(),
        client: c.client_addr,
        local: c.local_addr,
    };
    match chain::connect(&svc, parents, &want)? {
        chain::Route::Stream(chain) => Ok((chain.stream, chain.hops, chain.peer)),
        // ftppr does not hand clients on (nor does 3proxy's).
        chain::Route::Local { .. } => Err(Res::NOTIMPL),
    }
}

/// Log in to the server (3proxy's ftplogin): its greeting must be 2xx,
/// then USER, and PASS when asked. The result and what the client is told.
fn login(c: &mut Client, st: &mut State, pass: &[u8]) -> (Res, Vec<u8>) {
    let greet = srv_reply(c, st);
    if greet.len() < 3 {
        return (Res::FTP_NO_GREETING, Vec::new());
    }
    if greet[0] != b'2' {
        return (Res::FTP_BAD_GREETING, greet);
    }
    let name = st.login.as_ref().map_or(String::new(), |l| l.name.clone());
    let user = format!("USER {name}\r\n");
    if send(c, st, user.as_bytes(), Res::FTP_USER_SEND).is_err() {
        return (Res::FTP_USER_SEND, Vec::new());
    }
    let answer = srv_reply(c, st);
    if answer.len() < 3 {
        return (Res::FTP_USER_NO_REPLY, Vec::new());
    }
    match answer[0] {
        b'2' => return (Res::OK, answer),
        b'3' => {}
        _ => return (Res::FTP_LOGIN_REFUSED, answer),
    }
    let mut cmd = b"PASS ".to_vec();
    cmd.extend_from_slice(pass);
    cmd.extend_from_slice(b"\r\n");
    if send(c, st, &cmd, Res::FTP_PASS_SEND).is_err() {
        return (Res::FTP_PASS_SEND, Vec::new());
    }
    let mut told = Vec::new();
    loop {
        let l = srv_line(c, st);
        if l.len() < 3 {
            return (Res::FTP_PASS_NO_REPLY, told);
        }
        told.extend_from_slice(&l);
        if is_final(&l) {
            let ok = l[0] == b'2';
            return (if ok { Res::OK } else { Res::FTP_LOGIN_REFUSED }, told);
        }
    }
}

/// PASV, EPSV or PORT: the proxy's side of the client's data connection.
fn prepare_data(c: &mut Client, st: &mut State, line: &[u8]) -> Result<String, Res> {
    let svc = c.svc().clone();
    let local = c.local_addr.ok_or(Res::FTP_DATA_SOCKET)?;
    let bind = SocketAddr::new(local.ip(), 0);
    if starts_ci(line, b"PORT ") {
        let port = port_arg(&line[5..]).ok_or(Res::FTP_BAD_PORT)?;
        let client = c.client_addr.ok_or(Res::FTP_DATA_CONNECT)?;
        let to = SocketAddr::new(client.ip(), port);
        let domain = if bind.is_ipv4() {
            Domain::IPV4
        } else {
            Domain::IPV6
        };
        let sock = Socket::new(domain, Type::STREAM.cloexec(), Some(Protocol::TCP))
            .map_err(|_| Res::FTP_DATA_SOCKET)?;
        sock.bind(&SockAddr::from(bind))
            .map_err(|_| Res::FTP_DATA_BIND)?;
        sock.connect_timeout(&SockAddr::from(to), svc.timeouts.get(Timeouts::CONNECT))
            .map_err(|_| Res::FTP_DATA_CONNECT)?;
        st.data = Data::Connected(Stream::Tcp(sock.into()));
        return Ok("200 OK\r\n".to_string());
    }
    let l = TcpListener::bind(bind).map_err(|_| Res::FTP_DATA_BIND)?;
    let port = l.local_addr().map_err(|_| Res::FTP_DATA_NAME)?.port();
    st.data = Data::Listening(l);
    if starts_ci(line, b"EPSV") {
        return Ok(epsv_reply(port));
    }
    let ip = match local.ip() {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(_) => Ipv4Addr::LOCALHOST,
    };
    Ok(pasv_reply(ip, port))
}

/// Open the server's data connection (3proxy's ftpdata, op FTP_DATA) and
/// send the command; None when any step fails.
fn server_data(c: &mut Client, st: &mut State, line: &[u8]) -> Option<Stream> {
    let svc = c.svc().clone();
    send(c, st, b"PASV\r\n", Res::OK).ok()?;
    let r = srv_reply(c, st);
    if r.len() < 7 || r[0] != b'2' {
        return None;
    }
    let port = pasv_port(&r)?;
    let ip = st.srv.as_ref()?.peer_addr()?.ip();
    let dst = SocketAddr::new(ip, port);
    let l = st.login.as_ref()?;
    let req = Request {
        host: Some(&l.host),
        addr: Some(ip),
        port,
        user: l.user.as_deref(),
        password: l.password.as_deref(),
        ..c.request(Op::FtpData)
    };
    let grant = access::authorize_at(&svc, &req, st.weight).ok()?;
    let (data, _, _) = connect(c, dst, None, l, &grant.parents).ok()?;
    let cmd = &line[..4];
    let arg = line.get(5..).filter(|a| !a.is_empty() && line[4] != 0);
    let mut out = cmd.to_vec();
    if let Some(a) = arg {
        out.push(b' ');
        out.extend_from_slice(&a[..a.len().min(512)]);
    }
    out.extend_from_slice(b"\r\n");
    send(c, st, &out, Res::OK).ok()?;
    let r = srv_reply(c, st);
    (r.len() >= 3 && r[0] == b'1').then_some(data)
}

/// A data command: RETR, LIST, NLST, MLSD, STOR or APPE.
fn transfer(c: &mut Client, st: &mut State, line: &[u8]) -> Result<(), Res> {
    let svc = c.svc().clone();
    let op = if starts_ci(line, b"RETR") {
        Op::FtpGet
    } else if starts_ci(line, b"STOR") || starts_ci(line, b"APPE") {
        Op::FtpPut
    } else {
        Op::FtpList
    };
    let mut cmd = line.to_vec();
    run_filters(c, filter::CLIHEADER, op, &mut cmd, Res::FTP_FILTER_TRANSFER)?;
    let line = &cmd[..];
    if line.len() < 4 {
        return Err(Res::FTP_FILTER_TRANSFER);
    }
    let cli_data = match std::mem::replace(&mut st.data, Data::None) {
        Data::None => return Err(Res::FTP_NO_DATA),
        Data::Connected(s) => s,
        Data::Listening(l) => {
            let sock = Socket::from(l);
            let _ = sock.set_read_timeout(Some(svc.timeouts.get(Timeouts::STRING_LONG)));
            match sock.accept() {
                Ok((s, _)) => Stream::Tcp(s.into()),
                Err(e) if crate::net::is_timeout(&e) => return Err(Res::FTP_DATA_TIMEOUT),
                Err(_) => return Err(Res::FTP_DATA_ACCEPT),
            }
        }
    };
    st.req = Some(text(line));
    st.status = 3;
    let Some(srv_data) = server_data(c, st, line) else {
        let _ = cli_data.shutdown(Shutdown::Both);
        return tell(c, b"550 err\r\n", Res::FTP_DATA_REFUSED_TELL);
    };
    tell(c, b"125 data\r\n", Res::FTP_DATA_START_TELL)?;
    let mut sent = false;
    while let Some(l) = st.rd.buffered() {
        tell(c, &l, Res::FTP_TRANSFER_TELL)?;
        if is_final(&l) {
            sent = true;
            break;
        }
    }
    let opts = RelayOpts {
        // A data connection carries one direction: its first EOF ends it.
        session_end: true,
        splice: false,
        ..crate::session::relay_opts(&svc, Timeouts::CONNECTION_SHORT)
    };
    // `clidata` on what the client sends on the data connection (STOR),
    // `srvdata` on what the server sends (RETR, listings), as 3proxy's
    // sockmap does.
    let host = c
        .req_host
        .as_deref()
        .map(crate::acl::normalize_host)
        .unwrap_or_default();
    let client: &Client = c;
    let filter = svc
        .filters
        .as_deref()
        .filter(|f| f.has(filter::CLIDATA | filter::SRVDATA))
        .map(|filters| DataFilter {
            filters,
            query: filter_query(client, filters, &host, op),
            max: svc.filtermaxsize,
        });
    let out = crate::relay::relay_hooked(
        &cli_data,
        &srv_data,
        &opts,
        Hooks {
            limits: st.limits.as_deref(),
            recheck: None,
            dump: None,
            filter,
            live: None,
        },
    );
    c.record.bytes_out += out.out;
    c.record.bytes_in += out.inb;
    c.record.ops.add(out.ops);
    if out.res == Res::FILTER {
        // The data connection is closed; the session goes on, as in
        // 3proxy, and the transfer's record says why it was cut.
        c.record.res = Res::FILTER;
    }
    let _ = srv_data.shutdown(Shutdown::Both);
    let _ = cli_data.shutdown(Shutdown::Both);
    drop((srv_data, cli_data));
    if !sent {
        loop {
            let l = srv_line(c, st);
            if l.len() <= 3 {
                if l.len() < 3 {
                    return Err(Res::FTP_TRANSFER_NO_ANSWER);
                }
                break;
            }
            tell(c, &l, Res::FTP_TRANSFER_TELL)?;
            if is_final(&l) {
                break;
            }
        }
    }
    Ok(())
}
