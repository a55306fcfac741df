//! A kept-alive client parked between two requests (`parklinger`):
//! what its session carries to the next request, and its resumption.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::net::Stream;
use crate::parent;
use crate::service::Service;

use super::fields::{forwarding_fields, remade_alike};
use super::session::{Inside, Session};
use super::sock::readable_within;

/// A kept-alive connection parked between two requests (`parklinger`):
/// what its [`Session`] carries from one request to the next, and no
/// more. The rest of a session (head buffers, the current request's
/// host, grant and credentials) is made anew for each request anyway,
/// so a parked client keeps 100-odd bytes here instead of a whole
/// session and its strings (issue 19: an idle client's memory).
pub(super) struct ParkedHttp {
    svc: Arc<Service>,
    /// The forwarding fields as made for the connection, when they cannot
    /// be made again alike (`-a1` makes up its address once per
    /// connection); None: made again from the client on resume.
    extra: Option<Vec<u8>>,
    redirected_to: Option<SocketAddr>,
    weight: u32,
    base_hops: u32,
    cli_rto: Option<Duration>,
    cli_want: Duration,
    cli_wto: bool,
    /// `ssl_mitm`: the intercepted tunnel whose requests these are.
    inside: Option<Box<Inside>>,
    /// The end of the wait for the next request (STRING_SHORT after the
    /// last response).
    deadline: Instant,
}

impl ParkedHttp {
    /// What `s` carries over; `s` is dropped (its origin connection went
    /// to the pool already).
    pub(super) fn keep(mut s: Box<Session>, deadline: Instant, c: &Client) -> ParkedHttp {
        ParkedHttp {
            svc: s.svc.clone(),
            extra: Some(std::mem::take(&mut s.extra)).filter(|_| !remade_alike(&s.svc, c)),
            redirected_to: s.redirected_to,
            weight: s.weight,
            base_hops: s.base_hops,
            cli_rto: s.cli_rto,
            cli_want: s.cli_want,
            cli_wto: s.cli_wto,
            inside: s.inside.take(),
            deadline,
        }
    }

    /// The session again, as [`ParkedHttp::keep`] found it between two
    /// requests; `linger` is set by [`requests`].
    fn session(self, c: &Client) -> Box<Session> {
        let extra = self
            .extra
            .unwrap_or_else(|| forwarding_fields(&self.svc, c));
        let mut s = Box::new(Session::with(
            self.svc,
            extra,
            self.redirected_to,
            self.base_hops,
        ));
        s.weight = self.weight;
        s.cli_rto = self.cli_rto;
        s.cli_want = self.cli_want;
        s.cli_wto = self.cli_wto;
        s.inside = self.inside;
        s
    }
}

impl crate::client::Tail for ParkedHttp {
    fn fds<'a>(&'a self, cli: &'a Stream) -> Vec<std::os::fd::BorrowedFd<'a>> {
        use std::os::fd::AsFd;
        vec![cli.as_fd()]
    }

    fn deadline(&self) -> Instant {
        self.deadline
    }

    fn generation(&self) -> u64 {
        // Each request is authorized anew: nothing to check after a
        // reload.
        crate::generation::generation()
    }

    fn resume(self: Box<Self>, c: &mut Client, how: crate::client::Resumed) -> parent::Next {
        let may_park = how.may_park;
        // Woken by the client's socket: its next request (or its close)
        // is there, and asking costs a poll a request.
        if !how.ready && !readable_within(&c.cli, Duration::ZERO) {
            if Instant::now() >= self.deadline {
                // No next request: the connection ends, with no record
                // (as when a thread's wait for it times out).
                return c.next();
            }
            if may_park {
                // Woken for nothing (a reload): back to the lot.
                c.parked = Some(self);
                return c.next();
            }
        }
        // The session made again at this shallow point of the stack (as
        // `Session::new` is), with room for the heads.
        let s = self.session(c);
        s.serve_loop(c, &[], false, may_park);
        c.next()
    }
}
