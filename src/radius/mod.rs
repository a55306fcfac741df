//! The RADIUS client: the servers of the `radius` line, asked in order
//! (failover), for `auth radius` on the client's thread and for `log
//! radius` accounting on sender threads of its own (3proxy's
//! authradius.c `radsend`). The packets themselves are `proto::radius`.
//!
//! - Authentication: each server in turn gets the Access-Request and is
//!   waited for up to the `timeouts` slot 1 (BYTE_LONG, 3proxy's
//!   `SINGLEBYTE_L`, 5 s by default), the request sent again once at half
//!   that time (a retransmission: same identifier and authenticator). A
//!   server that does not answer, or answers with something that does not
//!   check out, hands over to the next, and is asked after the others for
//!   [`servers::HOLD_DOWN`]; when none is left the client is refused with
//!   [`crate::res::Res::RADIUS_NO_ANSWER`]. So a client thread waits at most servers
//!   x BYTE_LONG.
//! - Accounting: [`account`] encodes a request on the client thread,
//!   in a buffer the sender gave back (no allocation in the steady
//!   state), queues it (bounded: past [`acct::QUEUE`] requests one is dropped
//!   and counted) and returns at once. One sender thread ([`acct::SENDERS`])
//!   keeps up to 256 requests in flight per server (one socket each,
//!   answers matched by identifier and checked by their Response
//!   Authenticator), sends and reads them in batches (`sendmmsg`,
//!   `recvmmsg`) every `acct::GATHER` while busy, sends each again once at
//!   half the wait and hands it to the next server at the wait (the
//!   same timeouts and failover as authentication). A session's
//!   requests go in order: each waits until the one before it was
//!   answered or given up. On exit [`flush`] waits, bounded, until what
//!   was queued is done. Start and Stop are [`Record`]s from the
//!   session's fields; an Interim-Update is the same with
//!   [`crate::proto::radius::Status::InterimUpdate`] and the counters so far (`logdump`
//!   records send one).
//! - `radiusinterim`: a session's [`Track`], hung on its live-registry
//!   entry at its Start, lets one timer thread for the whole process
//!   (`timer::interim_loop`) send each live session an Interim-Update every
//!   interval, with the counters the relay keeps there; the Stop takes
//!   the track off first, so no Interim-Update follows a Stop.
//!
//! Invariant: every wait is bounded by the timeout; nothing here blocks
//! a client thread on the accounting server.
//!
//! The parts, each importing only the ones before it: `servers` the
//! `radius` line (its servers in order, which are held down, the socket
//! to one), `fields` what a request says of a session (its fields and
//! Acct-Session-Id), `auth` the Access-Request, `acct` the accounting
//! queue and its sender thread (the batch engine, with its own hasher
//! for session keys), `timer` a session's accounting state and the
//! `radiusinterim` thread.

mod acct;
mod auth;
mod fields;
mod servers;
mod timer;

pub use acct::{account, flush, next_key, Record};
pub use auth::{authenticate, Accepted};
pub use fields::{session_id, Fields, SessionId, View};
pub use servers::{Conf, Server, Slot, MAX_SECRET, MAX_SERVERS};
pub use timer::{Accounting, Track};
