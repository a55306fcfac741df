//! The admin service's pages: HTML (the start page, counters, parents,
//! live sessions), `/sessions`'s JSON, `/S`'s XML and its style sheet,
//! and the helpers they share (escaping, times).

use std::time::Instant;

use crate::limit::{CountKind, Period};

/// Escape text for HTML (`crate::escape`).
pub(super) use crate::escape::html as escape;

/// A whole page: [`page_top`], [`heading`], `content`, [`PAGE_END`].
pub(super) fn page(title: &str, content: &str) -> String {
    format!("{}{}{content}{PAGE_END}", page_top(title), heading(title))
}

/// A page's start: the document's head and the links to the others
/// (what StringsPlugin's admin entry 1 replaces).
pub(super) fn page_top(title: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><title>threeproxy: {t}</title></head>\n<body>\n\
         <p><a href=\"/\">Home</a> | <a href=\"/C\">Counters</a> | \
         <a href=\"/L\">Sessions</a> | <a href=\"/S\">Running services</a> | \
         <a href=\"/F\">Configuration</a> | <a href=\"/R\">Reload</a></p>\n",
        t = escape(title)
    )
}

/// A page's heading, after its start.
pub(super) fn heading(title: &str) -> String {
    format!("<h1>{}</h1>\n", escape(title))
}

/// A page's end (what StringsPlugin's admin entry 5 replaces).
pub(super) const PAGE_END: &str = "</body></html>\n";

/// A string as a JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_opt(s: Option<&str>) -> String {
    s.map_or_else(|| "null".to_string(), json_str)
}

fn unix_secs(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn age(t: std::time::SystemTime) -> f64 {
    t.elapsed().map_or(0.0, |d| d.as_secs_f64())
}

/// `/sessions`: one object per live session.
pub(super) fn sessions_json(all: &[crate::live::View]) -> String {
    let mut out = String::from("[");
    for (i, v) in all.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let client = v.info.client.map(|a| a.to_string());
        let parent = v.info.parent.map(|a| a.to_string());
        out += &format!(
            "\n{{\"id\":{},\"service\":{},\"port\":{},\"client\":{},\"user\":{},\
             \"dest\":{},\"parent\":{},\"bytes_out\":{},\"bytes_in\":{},\
             \"start\":{:.3},\"age\":{:.3},\"ended\":{}}}",
            v.id,
            json_str(v.service),
            v.port,
            json_opt(client.as_deref()),
            json_opt(v.info.user.as_deref()),
            json_opt(v.info.dest().as_deref()),
            json_opt(parent.as_deref()),
            v.bytes_out,
            v.bytes_in,
            unix_secs(v.start),
            age(v.start),
            v.ended
        );
    }
    out += "\n]\n";
    out
}

/// Percent-encode a query value (`crate::escape`).
use crate::escape::query as url_encode;

/// The parents' health for `/metrics`.
pub(super) fn parent_health() -> Vec<crate::metrics::ParentHealth> {
    let (now, wall) = (Instant::now(), std::time::SystemTime::now());
    crate::health::views(now)
        .into_iter()
        .map(|v| crate::metrics::ParentHealth {
            up: !v.down,
            down_since: v.down_for.and_then(|d| wall.checked_sub(d)).map(unix_secs),
            fails: v.fails,
            name: v.name,
        })
        .collect()
}

/// `/P`: each parent of the running cfg (and of cfgs whose sessions
/// still run) with its health.
pub(super) fn parents_page() -> String {
    let all = crate::health::views(Instant::now());
    let mut out = format!(
        "<p>{} parent(s). <a href=\"/P\">Refresh</a> | \
         <a href=\"/metrics\">Metrics</a></p>\n\
         <table border=\"1\" id=\"parents\">\n<tr><th>Parent</th><th>State</th>\
         <th>Down for (s)</th><th>Failures in a row</th></tr>\n",
        all.len()
    );
    for v in &all {
        let state = match (v.down, v.held) {
            (false, _) => "up",
            (true, true) => "down",
            (true, false) => "down, being tried again",
        };
        let down_for = v
            .down_for
            .map_or_else(|| "-".to_string(), |d| d.as_secs().to_string());
        out += &format!(
            "<tr><td>{}</td><td>{state}</td><td>{down_for}</td><td>{}</td></tr>\n",
            escape(&v.name),
            v.fails
        );
    }
    out += "</table>\n";
    out
}

/// `/L`: the live sessions with "end" buttons (`me`: this request's own
/// session, which has none).
pub(super) fn sessions_page(all: &[crate::live::View], me: u64) -> String {
    let mut out = format!(
        "<p>{} live session(s). <a href=\"/L\">Refresh</a> | \
         <a href=\"/sessions\">JSON</a></p>\n\
         <table border=\"1\" id=\"sessions\">\n<tr><th>Id</th><th>Service</th><th>Client</th>\
         <th>User</th><th>Destination</th><th>Parent</th><th>Bytes out</th><th>Bytes in</th>\
         <th>Age (s)</th><th>End</th></tr>\n",
        all.len()
    );
    for v in all {
        let opt = |s: Option<String>| s.map_or_else(|| "-".to_string(), |s| escape(&s));
        let mut end = String::new();
        if v.ended {
            end += "ending";
        } else if v.id != me {
            end += &format!(
                "<form method=\"POST\" action=\"/E?id={id}\" style=\"display:inline\">\
                 <button type=\"submit\" id=\"end-{id}\">End</button></form>",
                id = v.id
            );
            if let Some(u) = &v.info.user {
                end += &format!(
                    " <form method=\"POST\" action=\"/E?user={}\" style=\"display:inline\">\
                     <button type=\"submit\" class=\"end-user\">End all of {}</button></form>",
                    escape(&url_encode(u)),
                    escape(u)
                );
            }
        }
        out += &format!(
            "<tr id=\"session-{}\"><td>{}</td><td>{}:{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{end}</td></tr>\n",
            v.id,
            v.id,
            escape(v.service),
            v.port,
            opt(v.info.client.map(|a| a.to_string())),
            opt(v.info.user.clone()),
            opt(v.info.dest()),
            opt(v.info.parent.map(|a| a.to_string())),
            v.bytes_out,
            v.bytes_in,
            age(v.start)
        );
    }
    out += "</table>\n";
    out
}

/// A time as ctime(3) writes it, without its newline (3proxy's
/// datetime values in `/S`).
fn ctime(t: std::time::SystemTime) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = unix_secs(t) as i64;
    let tm = crate::sys::time::local(secs);
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {}",
        DAYS[tm.wday as usize % 7],
        MONTHS[(tm.mon as usize + 11) % 12],
        tm.mday,
        tm.hour,
        tm.min,
        tm.sec,
        tm.year
    )
}

/// An address as 3proxy's `/S` writes one: `[ip]:port`.
fn sa(a: std::net::SocketAddr) -> String {
    format!("[{}]:{}", a.ip(), a.port())
}

/// One `<parameter>` of `/S` with a plain value, at `level` tabs.
fn xml_param(out: &mut String, level: usize, name: &str, ty: &str, what: &str, value: &str) {
    for _ in 0..level {
        out.push('\t');
    }
    // CDATA cannot hold its own end marker: split it where it occurs.
    let value = value.replace("]]>", "]]]]><![CDATA[>");
    out.push_str(&format!(
        "<parameter><name>{name}</name><type>{ty}</type><description>{what}</description>\
         <value><![CDATA[{value}]]></value>\n</parameter>"
    ));
}

/// `/S`'s start: the XML prolog, up to the services' description
/// (StringsPlugin's admin entry 2 replaces it, with the HTTP head).
pub(super) const XML_START: &str = "<?xml version=\"1.0\"?>\r\n\
    <?xml-stylesheet href=\"/SX\" type=\"text/css\"?>\r\n<services>\r\n\
    <description>Services currently running and connected clients</description>\r\n";

/// `/S`'s end (StringsPlugin's admin entry 3).
pub(super) const XML_END: &str = "</services>\r\n";

/// `/S`'s body: the running services, each with its connected clients,
/// in the XML 3proxy's webadmin.c writes (items of parameters with name,
/// type, description and value), for the properties threeproxy has.
pub(super) fn services_items(all: &[crate::live::View]) -> String {
    let mut out = String::from("<item>");
    let services: Vec<_> = crate::running::all()
        .iter()
        .filter(|r| !r.stopped())
        .map(|r| r.current())
        .collect();
    for (i, svc) in services.iter().enumerate() {
        if i > 0 {
            out.push_str("</item>\n<item>");
        }
        let port = svc.port();
        let children: Vec<&crate::live::View> = all
            .iter()
            .filter(|v| v.service == svc.def.name && v.port == port)
            .collect();
        xml_param(
            &mut out,
            0,
            "servicetype",
            "string",
            "type of the service/client",
            svc.def.name,
        );
        xml_param(
            &mut out,
            0,
            "childcount",
            "integer",
            "number of servers connected",
            &children.len().to_string(),
        );
        xml_param(
            &mut out,
            0,
            "maxchild",
            "integer",
            "max concurrent connections",
            &svc.maxconn.to_string(),
        );
        if let crate::net::Addr::Ip(a) = &svc.listen {
            xml_param(
                &mut out,
                0,
                "intsa",
                "sa",
                "ip address of internal interface",
                &sa(*a),
            );
        }
        if children.is_empty() {
            continue;
        }
        out.push_str(
            "<parameter><name>child</name><type>client</type>\
             <description>connected clients</description>\n<item>",
        );
        for (j, v) in children.iter().enumerate() {
            if j > 0 {
                out.push_str("</item>\n<item>");
            }
            let l = 1;
            xml_param(
                &mut out,
                l,
                "servicetype",
                "string",
                "type of the client",
                v.service,
            );
            xml_param(
                &mut out,
                l,
                "starttime",
                "datetime",
                "client started seconds",
                &ctime(v.start),
            );
            if let Some(h) = &v.info.host_text() {
                xml_param(
                    &mut out,
                    l,
                    "hostname",
                    "string",
                    "name of the requested host",
                    h,
                );
            }
            if let Some(u) = &v.info.user {
                xml_param(&mut out, l, "username", "string", "client username", u);
            }
            if let Some(a) = v.info.client {
                xml_param(&mut out, l, "clisa", "sa", "client sa", &sa(a));
            }
            if let Some(a) = v.info.parent {
                xml_param(&mut out, l, "srvsa", "sa", "target server sa", &sa(a));
            }
            xml_param(
                &mut out,
                l,
                "bytesin",
                "unsigned64",
                "bytes from server to client",
                &v.bytes_in.to_string(),
            );
            xml_param(
                &mut out,
                l,
                "bytesout",
                "unsigned64",
                "bytes from client to server",
                &v.bytes_out.to_string(),
            );
        }
        out.push_str("</item></parameter>");
    }
    out.push_str("</item>");
    out
}

/// `/SX`: the style sheet `/S` names, so a browser shows the dump as
/// boxes (our own rules, in the spirit of 3proxy's).
pub(super) const XML_STYLE: &str = "services { display: block; margin: 10px auto; width: 80%; \
font-family: sans-serif; font-size: small; }\n\
item { display: block; margin-bottom: 10px; border: 2px solid #ccc; padding: 10px; }\n\
parameter { display: block; padding: 2px; margin-top: 6px; border: 1px solid grey; }\n\
name { display: inline; margin-right: 5px; font-weight: bold; }\n\
type { display: inline; margin-right: 5px; font-size: x-small; font-style: italic; }\n\
description { display: inline; margin-right: 5px; }\n\
value { display: block; }\n";

fn kind_name(k: CountKind) -> &'static str {
    match k {
        CountKind::In => "countin",
        CountKind::Out => "countout",
        CountKind::All => "countall",
        CountKind::NoIn => "nocountin",
        CountKind::NoOut => "nocountout",
        CountKind::NoAll => "nocountall",
    }
}

fn period_name(p: Period) -> &'static str {
    match p {
        Period::Minutely => "minute",
        Period::Hourly => "hour",
        Period::Daily => "day",
        Period::Weekly => "week",
        Period::Monthly => "month",
        Period::Annually => "year",
        Period::Never => "never reset",
    }
}

fn when(t: i64) -> String {
    if t == 0 {
        return "never".into();
    }
    let tm = crate::sys::time::local(t);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        tm.year, tm.mon, tm.mday, tm.hour, tm.min, tm.sec
    )
}

pub(super) fn counters(svc: &crate::service::Service) -> String {
    let mut out = String::from(
        "<table border=\"1\">\n<tr><th>Rule</th><th>Number/comment</th><th>Users</th>\
         <th>Limit (bytes)</th><th>Period</th><th>Counted (bytes)</th>\
         <th>Reset</th><th>Updated</th></tr>\n",
    );
    for v in svc.access.limits.counter_views() {
        let users = match &v.users {
            None => "ANY".to_string(),
            Some(u) => escape(&u.join(", ")),
        };
        out += &format!("<tr><td>{}</td>", kind_name(v.kind));
        match &v.counter {
            None => {
                out += &format!(
                    "<td>-</td><td>{users}</td><td colspan=\"5\">excluded from counting</td></tr>\n"
                )
            }
            Some(c) => {
                out += &format!(
                    "<td>{}/{}</td><td>{users}</td><td>{}</td><td>{}</td><td>{}</td>\
                     <td>{}</td><td>{}</td></tr>\n",
                    c.number,
                    escape(&c.comment),
                    c.limit,
                    period_name(c.period),
                    c.traf,
                    when(c.cleared),
                    when(c.updated)
                )
            }
        }
    }
    out += "</table>\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::admin::request::form_field;

    #[test]
    fn json_and_query_values_are_escaped() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
        assert_eq!(json_opt(None), "null");
        assert_eq!(url_encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        // A user name with markup and a query's own characters survives
        // the round trip through the end button's URL.
        let u = "<x&y=z>";
        let q = format!("user={}", url_encode(u));
        assert_eq!(form_field(q.as_bytes(), b"user").unwrap(), u.as_bytes());
    }

    #[test]
    fn xml_values_cannot_end_their_cdata() {
        let mut out = String::new();
        xml_param(
            &mut out,
            1,
            "username",
            "string",
            "client username",
            "a]]>b",
        );
        assert_eq!(
            out,
            "\t<parameter><name>username</name><type>string</type><description>client \
             username</description><value><![CDATA[a]]]]><![CDATA[>b]]></value>\n</parameter>"
        );
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
    }
}
