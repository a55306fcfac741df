//! `admin`: the web admin (3proxy's webadmin.c). An HTTP/1.0 server of a
//! few pages, one request per connection:
//!
//! * `/` the start page, linking the others;
//! * `/C` the traffic counters: each `countin`/`countout`/`countall` rule
//!   with its users, limit, period, current value and times; `/CD<n>` and
//!   `/CS<n>` are 3proxy's links to switch a counter off and on, shown but
//!   answered as `/C` (a counter cannot be switched off here);
//! * `/R` schedules a reload, exactly as SIGUSR1 does;
//! * `/F` the cfg file's text, HTML-escaped; with `writable` in the cfg,
//!   inside 3proxy's form that posts it to `/U`;
//! * `/U` (POST, form field `conffile`): with `writable`, the cfg file is
//!   rewritten in place with the posted text (3proxy's webadmin.c);
//!   without it, 403. The new text takes effect at the next reload
//!   (`/R`).
//!
//! * `/S` 3proxy's XML dump of the running services and their connected
//!   clients (webadmin.c's `/S`, built on the live registry), `/SX` its
//!   style sheet;
//! * `/metrics` the counters in Prometheus's text exposition format
//!   (`crate::metrics`);
//! * `/P` the parents' health (`crate::health`): up or down, for how
//!   long, failures in a row;
//! * `/sessions` the live sessions as JSON, `/L` as a page with "end"
//!   buttons, which post to `/E?id=N` or `/E?user=NAME` (ends that one
//!   session, or all of the user's; answered 303 to `/L`).
//!
//! Any other path is 404; a request that is not `GET` or `POST` with a
//! parsable head is 400.
//!
//! Access: `auth` and the ACL with operation ADMIN; the user and password
//! come from a Basic `Authorization` header. Any refusal is answered 401
//! with `WWW-Authenticate: Basic realm="proxy"`, as 3proxy does (a refusal
//! by a limit, code 10, is let through, also as 3proxy). With `-s` only
//! the read-only pages are served (start, counters, `/S`, `/metrics`,
//! `/P`, `/sessions`, `/L`). The log record's `%T` is the
//! path asked for.
//!
//! This file is the service's entry and the router (access, then which
//! page). The parts, none of which imports it: `request` reads a request
//! (the head by `proto::http`'s rules, form fields) and sends the
//! answers; `pages` renders the pages (HTML, and `/sessions`'s JSON and
//! `/S`'s XML); `edit` is the cfg editor (`/F`, `/U`); `end` ends live
//! sessions (`/E`).

mod edit;
mod end;
mod pages;
mod request;

use std::time::Duration;

use crate::access::{Op, Request};
use crate::client::Client;
use crate::res::Res;
use crate::service::Service;
use crate::stringtable;
use crate::timeouts::Timeouts;
use pages::{
    counters, parent_health, parents_page, services_items, sessions_json, sessions_page, XML_END,
    XML_START, XML_STYLE,
};
use request::{
    error_page, parse_head, read_head, respond_as, respond_bytes, send_page, send_raw, Head,
    BAD_REQUEST, NOT_FOUND,
};

pub use edit::{set_cfg, set_writable};

pub fn serve(
    c: &mut Client,
    early: &[u8],
    _: Option<&crate::parent::Known>,
) -> crate::parent::Next {
    let redirected = c.redirected;
    serve_request(c, early, redirected);
    crate::parent::Next::Done
}

fn serve_request(c: &mut Client, early: &[u8], redirected: bool) {
    let svc = c.svc().clone();
    let wait = Duration::from_secs(u64::from(svc.timeouts.0[Timeouts::STRING_SHORT]).max(1));
    let Some(buf) = read_head(c, early, wait) else {
        c.record.text = "-".into();
        return error_page(c, BAD_REQUEST, "400 Bad Request", "", "Unreadable request.");
    };
    let Some(head) = parse_head(&buf) else {
        c.record.text = "-".into();
        return error_page(c, BAD_REQUEST, "400 Bad Request", "", "Malformed request.");
    };
    c.live.busy();
    c.record.text = head.path.clone();
    if head.method != "GET" && head.method != "POST" {
        return error_page(
            c,
            BAD_REQUEST,
            "400 Bad Request",
            "",
            "Only GET and POST are answered.",
        );
    }
    c.user = head.user.clone();
    let req = Request {
        user: head.user.as_deref(),
        password: head.password.as_deref(),
        ..c.request(Op::Admin)
    };
    if let Err(res) = crate::access::authorize(&svc, &req) {
        if res != Res::QUOTA {
            let replaced = svc.strings.as_deref();
            if let Some(page) = replaced.and_then(|t| t.admin(stringtable::ADMIN_AUTH)) {
                c.record.res = res;
                return send_raw(c, &[page]);
            }
            return error_page(
                c,
                res,
                "401 Authentication Required",
                "WWW-Authenticate: Basic realm=\"proxy\"\r\n",
                "Access denied.",
            );
        }
    }
    let limited = redirected || svc.opts.s_option.is_some();
    route(c, &svc, &head, &buf, wait, limited);
}

/// Answer the page `head` asks for (`limited`: only the read-only ones).
fn route(c: &mut Client, svc: &Service, head: &Head, buf: &[u8], wait: Duration, limited: bool) {
    let path = head.path.split('?').next().unwrap_or("");
    let strings = svc.strings.as_deref();
    let (title, content): (&str, String) = match path {
        "/" => (
            "Web admin",
            "<ul>\n<li><a href=\"/C\">Traffic counters</a></li>\n\
             <li><a href=\"/L\">Live sessions</a></li>\n\
             <li><a href=\"/P\">Parents</a></li>\n\
             <li><a href=\"/S\">Running services (XML)</a></li>\n\
             <li><a href=\"/metrics\">Metrics (Prometheus)</a></li>\n\
             <li><a href=\"/F\">Configuration file</a></li>\n\
             <li><a href=\"/R\">Reload the configuration</a></li>\n</ul>\n"
                .into(),
        ),
        p if p.starts_with("/C") && (p.len() == 2 || p[2..].starts_with(['D', 'S'])) => {
            ("Traffic counters", counters(svc))
        }
        "/metrics" => {
            c.record.res = Res::OK;
            let body = crate::metrics::render(
                crate::live::count(),
                crate::park::count(),
                &parent_health(),
            );
            return respond_as(
                c,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                "",
                &body,
            );
        }
        "/sessions" => {
            c.record.res = Res::OK;
            let body = sessions_json(&crate::live::snapshot());
            return respond_as(c, "200 OK", "application/json", "", &body);
        }
        "/S" => {
            c.record.res = Res::OK;
            // StringsPlugin's start (HTTP head included) and end, if any.
            let items = services_items(&crate::live::snapshot());
            let start = strings.and_then(|t| t.admin(stringtable::ADMIN_XML_HEAD));
            let end = strings
                .and_then(|t| t.admin(stringtable::ADMIN_XML_TAIL))
                .unwrap_or(XML_END.as_bytes());
            return match start {
                Some(start) => send_raw(c, &[start, items.as_bytes(), end]),
                None => respond_bytes(
                    c,
                    "200 OK",
                    "text/xml; charset=utf-8",
                    "Content-Disposition: inline; filename=running.xml\r\n",
                    &[XML_START.as_bytes(), items.as_bytes(), end],
                ),
            };
        }
        "/SX" => {
            c.record.res = Res::OK;
            return match strings.and_then(|t| t.admin(stringtable::ADMIN_STYLE)) {
                Some(style) => send_raw(c, &[style]),
                None => respond_as(c, "200 OK", "text/css", "", XML_STYLE),
            };
        }
        "/P" => ("Parents", parents_page()),
        "/L" => (
            "Live sessions",
            sessions_page(&crate::live::snapshot(), c.live.id()),
        ),
        _ if limited => {
            return error_page(c, NOT_FOUND, "404 Not Found", "", "No such page.");
        }
        "/R" => {
            ::log::warn!("admin: reload asked for by {:?}", c.client_addr);
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGUSR1);
            ("Reload", "<p>Reload scheduled.</p>\n".into())
        }
        "/F" => match edit::cfg_page() {
            Ok(body) => ("Configuration file", body),
            Err((res, status, why)) => return error_page(c, res, status, "", why),
        },
        "/E" => return end::end_sessions(c, head),
        "/U" => match edit::update(c, head, buf, wait) {
            Ok(()) => (
                "Configuration updated",
                "<p>The file is written; <a href=\"/R\">reload</a> to apply it.</p>\n".into(),
            ),
            Err((res, status, why)) => return error_page(c, res, status, "", why),
        },
        _ => {
            return error_page(c, NOT_FOUND, "404 Not Found", "", "No such page.");
        }
    };
    c.record.res = Res::OK;
    send_page(c, strings, title, &content);
}
