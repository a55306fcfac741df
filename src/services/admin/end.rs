//! `/E`: ending live sessions, one (`?id=N`) or all of a user's
//! (`?user=NAME`), from a POST of this service's own pages (the "end"
//! buttons of `/L`).

use std::time::Duration;

use super::pages::page;
use super::request::{error_page, form_field, respond, Head, BAD_REQUEST, FORBIDDEN};
use crate::client::Client;
use crate::res::Res;

/// `/E`: how long the answer waits for the ended sessions to be gone.
const END_WAIT: Duration = Duration::from_secs(3);

/// `/E`: end the sessions the query names, and answer 303 to `/L`.
pub(super) fn end_sessions(c: &mut Client, head: &Head) {
    if head.method != "POST" {
        return error_page(
            c,
            BAD_REQUEST,
            "400 Bad Request",
            "",
            "Ending sessions takes a POST.",
        );
    }
    if !same_site(head) {
        return error_page(
            c,
            FORBIDDEN,
            "403 Forbidden",
            "",
            "Sessions are ended only from this admin service's own pages.",
        );
    }
    let query = head.path.split_once('?').map_or("", |(_, q)| q);
    let id = form_field(query.as_bytes(), b"id")
        .and_then(|v| String::from_utf8(v).ok())
        .and_then(|v| v.parse::<u64>().ok());
    let user =
        form_field(query.as_bytes(), b"user").map(|v| String::from_utf8_lossy(&v).into_owned());
    let ended = match (id, &user) {
        (Some(id), _) => {
            if crate::live::end(id) {
                vec![id]
            } else {
                Vec::new()
            }
        }
        (None, Some(u)) => crate::live::end_user(u),
        (None, None) => {
            return error_page(
                c,
                BAD_REQUEST,
                "400 Bad Request",
                "",
                "Say which sessions: /E?id=N or /E?user=NAME.",
            );
        }
    };
    let n = ended.len();
    // The sessions' threads see their sockets close at once; give
    // them a moment to end, so the page redirected to no longer
    // lists them.
    crate::live::wait_gone(&ended, END_WAIT);
    ::log::warn!(
        "admin: {n} session(s) ended by {:?} ({})",
        c.client_addr,
        head.path
    );
    c.record.res = Res::OK;
    respond(
        c,
        "303 See Other",
        &format!("Location: /L\r\nX-Ended: {n}\r\n"),
        &page(
            "Sessions ended",
            &format!("<p>Ended {n} session(s). <a href=\"/L\">Back</a></p>\n"),
        ),
    );
}

/// A POST from a page of this admin service, or from no page at all (a
/// script): a browser names the page's site in `Origin`, which must then
/// be the `Host` asked for, so another site's page cannot make an
/// administrator's browser end sessions.
fn same_site(head: &Head) -> bool {
    let Some(origin) = head.origin.as_deref() else {
        return true;
    };
    let site = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    site.is_some() && site == head.host.as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::admin::request::parse_head;

    #[test]
    fn ending_takes_a_same_site_post() {
        let h = |extra: &str| {
            let raw = format!("POST /E?id=1 HTTP/1.0\r\nHost: 10.0.0.1:81\r\n{extra}\r\n");
            parse_head(raw.as_bytes()).unwrap()
        };
        assert!(same_site(&h("")));
        assert!(same_site(&h("Origin: http://10.0.0.1:81\r\n")));
        assert!(!same_site(&h("Origin: http://evil.example\r\n")));
        assert!(!same_site(&h("Origin: null\r\n")));
    }
}
