//! `tcppm`: the TCP port mapper (3proxy's tcppm.c, tcppm(8)). Every client
//! of `tcppm LPORT DSTHOST DSTPORT` is connected to DSTHOST:DSTPORT and the
//! bytes are relayed both ways.
//!
//! It is also the handler of `parent tcp 0.0.0.0 0`: a client another
//! service hands over is relayed to the destination that service chose
//! ([`serve_redirected`]). And a tcppm client whose ACL entry redirects
//! locally goes to that handler with tcppm's destination as the one
//! chosen (`parent::hand_over`).

use std::net::SocketAddr;

use crate::access::{Grant, Op, Recheck, Request};
use crate::acl::{self, Action, Query, Verdict};
use crate::chain;
use crate::client::Client;
use crate::net::{Stream, Target};
use crate::parent;
use crate::res::Res;
use crate::resolve::resolve;
use crate::service::Service;
use crate::session::{self, Park};
use crate::timeouts::Timeouts;

/// The client thread's work for one tcppm client.
pub fn serve(c: &mut Client, early: &[u8], dest: Option<&parent::Known>) -> parent::Next {
    if c.redirected {
        serve_redirected(c, early, dest);
    } else {
        serve_mapped(c);
    }
    c.next()
}

fn serve_mapped(c: &mut Client) {
    let svc = c.svc().clone();
    // `-R`: the server socket is a back-connection, taken first as in
    // 3proxy (see `crate::connectback`).
    let mut back = None;
    if let Some(l) = &svc.back_listener {
        let wait = svc.timeouts.get(Timeouts::CONNECTBACK);
        let tries = 5 + (svc.maxconn >> 10);
        let client = c.client_addr;
        let allowed = |peer| back_allowed(&svc, client, peer);
        match crate::connectback::server_socket(l, wait, tries, &allowed) {
            Ok(s) => back = Some(s),
            Err(why) => {
                c.record.text = why.to_string();
                c.record.res = Res::CONNECT;
                return;
            }
        }
    }
    // `transparent`: a redirected client goes where it meant to, not to
    // the mapped destination (3proxy's plugin names the host first).
    let original = c.original_dst().map(Target::Fixed);
    let Some(target) = original.as_ref().or(svc.target.as_ref()) else {
        c.record.res = Res::NOHOST;
        return;
    };
    // As in 3proxy, the destination as written is both %T and %n.
    c.record.text = target.host();
    c.req_host = Some(c.record.text.clone());
    // Resolve first: the ACL may list destination addresses.
    let dst = match target {
        Target::Fixed(a) => Ok(Some(*a)),
        Target::Name(host, port) => resolve(host, *port, svc.family).map(Some),
        Target::Unix(_) | Target::Abstract(_) => Ok(None),
    };
    let allowed = dst.and_then(|d| authorize(c, target, d));
    let ((dst, grant), recheck) = match allowed {
        Ok(x) => x,
        Err(res) => {
            c.record.res = res;
            return;
        }
    };
    let srv = match (back, dst) {
        (Some(s), dst) => {
            c.req_addr = dst;
            c.remote_addr = s.peer_addr();
            c.ext_addr = s.local_addr();
            Ok(Some(s))
        }
        (None, Some(a)) => connect(c, a, target, &grant),
        (None, None) => svc.dialer.connect_unix(target).map(Some),
    };
    match srv {
        Ok(Some(mut s)) => {
            let host = target.host();
            if let Err(res) = session::intercept(c, &mut s, &host, &[]) {
                c.record.res = res;
                c.srv = Some(s);
                return;
            }
            if let (Some(_), Some(addr)) = (&c.svc().mitm, c.req_addr) {
                // `ssl_mitm`: HTTP inside is served by the HTTP proxy.
                let inside = crate::services::proxy::Inside {
                    host,
                    port: addr.port(),
                    addr,
                    user: c.user.clone(),
                    password: None,
                };
                let hops = c.hops.saturating_sub(c.local_hops);
                match crate::services::proxy::serve_inside(c, s, inside, &grant.parents, hops) {
                    Some(back) => s = back,
                    None => return,
                }
            }
            session::relay_to(
                c,
                s,
                &grant,
                &recheck,
                &[],
                Timeouts::CONNECTION_LONG,
                Park::WhenQuiet,
            )
        }
        // Handed over to a local handler.
        Ok(None) => {}
        Err(res) => c.record.res = res,
    }
}

/// `parent tcp 0.0.0.0 0` in another service's ACL: relay the client to
/// the destination it already chose there (3proxy's tcppmchild with the
/// host name known), with this ACL pass skipping the entries that
/// redirect locally. `early` goes to the destination first.
fn serve_redirected(c: &mut Client, early: &[u8], dest: Option<&parent::Known>) {
    let Some(d) = dest else {
        c.record.res = Res::NOHOST;
        return;
    };
    let target = match &d.name {
        Some(n) => Target::Name(n.clone(), d.addr.port()),
        None => Target::Fixed(d.addr),
    };
    c.record.text = target.host();
    c.req_host = Some(c.record.text.clone());
    let ((_, grant), recheck) = match authorize(c, &target, Some(d.addr)) {
        Ok(x) => x,
        Err(res) => {
            c.record.res = res;
            return;
        }
    };
    match connect(c, d.addr, &target, &grant) {
        Ok(Some(s)) => session::relay_to(
            c,
            s,
            &grant,
            &recheck,
            early,
            Timeouts::CONNECTION_LONG,
            Park::WhenQuiet,
        ),
        Ok(None) => {}
        Err(res) => c.record.res = res,
    }
}

/// Ask the access layer for op CONNECT to the mapped destination. tcppm
/// has no protocol to say no in: a refused client is closed, and the log
/// record carries the code.
fn authorize(
    c: &mut Client,
    target: &Target,
    dst: Option<SocketAddr>,
) -> Result<((Option<SocketAddr>, Grant), Recheck), Res> {
    let req = Request {
        host: match target {
            Target::Name(h, _) => Some(h.as_str()),
            _ => None,
        },
        addr: dst.map(|a| a.ip()),
        port: dst.map_or(0, |a| a.port()),
        user: None,
        password: None,
        ..c.request(Op::Connect)
    };
    let (grant, again) = crate::session::admit(c, &req)?;
    Ok(((dst, grant), again))
}

/// Connect to an IP destination, through the grant's parents if it has
/// any, refusing to connect to ourselves. Ok(None): a local redirection
/// took the client (see [`parent::hand_over`]).
fn connect(
    c: &mut Client,
    dst: SocketAddr,
    target: &Target,
    grant: &Grant,
) -> Result<Option<Stream>, Res> {
    let svc = c.svc().clone();
    c.req_addr = Some(dst);
    if c.is_self(dst) {
        return Err(Res::LOOP);
    }
    let want = chain::Want {
        addr: Some(dst),
        host: match target {
            Target::Name(h, _) => Some(h.as_str()),
            _ => None,
        },
        client: c.client_addr,
        local: c.local_addr,
        ..chain::Want::default()
    };
    let chain = match chain::connect(&svc, &grant.parents, &want)? {
        chain::Route::Stream(chain) => chain,
        chain::Route::Local { kind, hops } => {
            // tcppm has nothing to say first: the next handler greets.
            let name = match target {
                Target::Name(h, _) => Some(h.clone()),
                _ => None,
            };
            c.hand_over(parent::Handoff::to(kind, hops, Vec::new(), name, dst))?;
            return Ok(None);
        }
    };
    let mut chain = chain;
    // `ssl_cli`: tcppm answers nothing, so every mode handshakes here.
    let host = want
        .host
        .map_or_else(|| crate::addr::ip_text(dst.ip()), str::to_string);
    for at in [session::DestAt::Reached, session::DestAt::Answered] {
        session::tls_to_dest(c, &mut chain.stream, &host, at, true)?;
    }
    // The stream goes to the relay, which leaves it in `c.srv`.
    crate::session::note_chain_ext_later(c, &chain);
    Ok(Some(chain.stream))
}

/// 3proxy's `checkACL` for a back-connection: the ACL alone (no `auth`,
/// no limits), with the back-connection's peer as the destination and no
/// operation. An empty ACL allows it.
fn back_allowed(svc: &Service, client: Option<SocketAddr>, peer: SocketAddr) -> bool {
    let (wday, daysec) = clock();
    let q = Query {
        user: None,
        src: client.map(|a| a.ip()),
        dst: Some(peer.ip()),
        host: None,
        port: peer.port(),
        op: 0,
        wday,
        daysec,
        weight: 0,
        redirected: false,
    };
    let ok = match acl::check(&svc.access.acl, &q) {
        Verdict::Empty => true,
        Verdict::Matched(i) => svc.access.acl[i].action == Action::Allow,
        Verdict::NoMatch => false,
    };
    if !ok {
        log::warn!(
            "{} on {}: back-connection from {peer} refused by the ACL",
            svc.def.name,
            svc.listen
        );
    }
    ok
}

fn clock() -> (u8, u32) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let tm = crate::sys::time::local(secs);
    (tm.wday as u8, tm.hour * 3600 + tm.min * 60 + tm.sec.min(59))
}
