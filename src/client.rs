//! One client connection's state, from accept to the log line (3proxy's
//! `clientparam`; `freeparam` is our `Drop`).
//!
//! A service's function fills in what it learns (destination, addresses,
//! result code, byte counts); when the `Client` is dropped, by whatever path,
//! its one access-log record is written and its service slot is freed.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::access::Scope;
use crate::access::{Op, Request};
use crate::logformat::LogRecord;
use crate::net::Stream;
use crate::parent::{self, Handoff, Next};
use crate::proto::radius::Status;
use crate::res::Res;
use crate::service::Service;

/// Least time between two "too many connected clients" warnings.
const WARN_EVERY: Duration = Duration::from_secs(5);

/// A live-client slot of a service. Dropping it frees the slot and wakes
/// the acceptor if it was waiting at `maxconn`, so a client that ends by
/// any path (return, error, panic) always gives its slot back.
pub struct Slot(Arc<Service>);

impl Slot {
    /// Take a slot if the service is below `maxconn`, without waiting
    /// (a client thread helping the acceptor, see `acceptor`).
    pub fn try_take(svc: &Arc<Service>) -> Option<Slot> {
        let mut live = svc.live.lock().unwrap_or_else(|e| e.into_inner());
        if *live >= svc.maxconn {
            return None;
        }
        *live += 1;
        crate::shutdown::session_started();
        Some(Slot(svc.clone()))
    }

    /// Take a slot, waiting while the service is full. Gives up (None)
    /// after a second so the acceptor can notice a reload or a stop.
    pub fn take(svc: &Arc<Service>, last_warn: &mut Option<Instant>) -> Option<Slot> {
        Slot::take_within(svc, last_warn, Duration::from_secs(1))
    }

    /// [`Slot::take`], giving up after `wait`.
    pub fn take_within(
        svc: &Arc<Service>,
        last_warn: &mut Option<Instant>,
        wait: Duration,
    ) -> Option<Slot> {
        let mut live = svc.live.lock().unwrap_or_else(|e| e.into_inner());
        if *live >= svc.maxconn {
            if !svc.reclaim && last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                log::warn!(
                    "{} on {}: too many connected clients ({}/{}), new ones wait",
                    svc.def.name,
                    svc.listen,
                    *live,
                    svc.maxconn
                );
                *last_warn = Some(Instant::now());
            }
            // Counted under the lock, so a slot freed meanwhile sees it.
            svc.slot_waiters.fetch_add(1, Ordering::Relaxed);
            let (l, _) = svc
                .left
                .wait_timeout_while(live, wait, |n| *n >= svc.maxconn)
                .unwrap_or_else(|e| e.into_inner());
            live = l;
            svc.slot_waiters.fetch_sub(1, Ordering::Relaxed);
            if *live >= svc.maxconn {
                return None;
            }
        }
        *live += 1;
        crate::shutdown::session_started();
        Some(Slot(svc.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut live = self.0.live.lock().unwrap_or_else(|e| e.into_inner());
        *live = live.saturating_sub(1);
        // A notify is a system call even when nobody waits: only when the
        // acceptor waits for a slot (it counted itself under the lock).
        let waiting = self.0.slot_waiters.load(Ordering::Relaxed) > 0;
        drop(live);
        crate::shutdown::session_ended();
        if waiting {
            self.0.left.notify_one();
        }
    }
}

/// Count a new session of a datagram service (udppm's associations,
/// dnspr's queries: `what`) against `maxconn`. False when the service is
/// full: the datagram is dropped, and a warning says so at most every
/// `WARN_EVERY`. The session's record gives the slot back when dropped.
pub fn take_datagram_slot(svc: &Service, last_warn: &mut Option<Instant>, what: &str) -> bool {
    let mut live = svc.live.lock().unwrap_or_else(|e| e.into_inner());
    if *live >= svc.maxconn {
        // A datagram cannot wait in a backlog: it is dropped.
        if last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            log::warn!(
                "{} on {}: too many {what} ({}), datagram dropped",
                svc.def.name,
                svc.listen,
                *live
            );
            *last_warn = Some(Instant::now());
        }
        return false;
    }
    *live += 1;
    crate::shutdown::session_started();
    true
}

/// The access-log record a client is building. A record carries the
/// session's fields (addresses, user, hops, service, all in [`Client`])
/// and these of its own, which begin again after each record: so a
/// second record (the next HTTP request, ftppr's next transfer, SOCKS
/// UDP's next destination) says only what happened since the first.
///
/// When it is written: [`Client::end_record`] writes it now, and the
/// `Client`'s drop writes it if it is still `open`; a record is never
/// written twice, and one that a `nolog` grant covers never.
pub struct Record {
    /// %T: the service text.
    pub text: String,
    pub res: Res,
    /// %O: bytes client -> server.
    pub bytes_out: u64,
    /// %I: bytes server -> client.
    pub bytes_in: u64,
    /// When the record began (%t, %D).
    pub start: SystemTime,
    /// The server's reads, writes and connects for this record
    /// (TrafficPlugin's `p` form counts packets by them).
    pub ops: crate::traffic::Ops,
    /// A datagram record (a SOCKS UDP association's): TrafficPlugin's
    /// `udp` rules are for it. Kept from record to record.
    pub datagram: bool,
    /// With TrafficPlugin rules: the limits of the grant this record is
    /// under, held until it is written, so that their counters take the
    /// bytes the record says (3proxy counts after its plugin corrected).
    limits: Option<Arc<crate::limit::SessionLimits>>,
    /// Something happened since the last record ended: the drop writes
    /// it. A session begins open; a kept-alive HTTP client between
    /// requests is not.
    open: bool,
    /// The last grant said `nolog`: records stay unwritten until a grant
    /// says otherwise (each HTTP request has its own).
    nolog: bool,
}

impl Record {
    fn new(start: SystemTime) -> Record {
        Record {
            text: String::new(),
            res: Res::OK,
            bytes_out: 0,
            bytes_in: 0,
            start,
            ops: crate::traffic::Ops::default(),
            datagram: false,
            limits: None,
            open: true,
            nolog: false,
        }
    }

    /// Begin the next record: the fields of its own start again, and it
    /// is closed until something opens it.
    fn next(&mut self) {
        self.bytes_in = 0;
        self.bytes_out = 0;
        self.ops = crate::traffic::Ops::default();
        self.limits = None;
        self.res = Res::OK;
        self.text.clear();
        self.start = SystemTime::now();
        self.open = false;
    }

    /// Something happened that the record is to say (a request head was
    /// read, a hand-off began, a SOCKS UDP destination's record was
    /// written and the association's own is still to come).
    pub fn open(&mut self) {
        self.open = true;
    }

    /// A new HTTP request: the record is open, and until its own grant
    /// says `nolog`, written.
    pub fn begin(&mut self) {
        self.open = true;
        self.nolog = false;
    }

    /// Nothing happened since the last record ended.
    pub fn is_closed(&self) -> bool {
        !self.open
    }

    /// What the last grant said of `nolog`.
    pub fn set_nolog(&mut self, nolog: bool) {
        self.nolog = nolog;
    }
}

/// An accepted client on its way to a client thread.
pub struct Accepted {
    pub stream: Stream,
    /// The settings the client is served with: those current when it
    /// was accepted (a reload may come while the acceptor waits).
    pub svc: Arc<Service>,
    /// The reload generation read just before `svc`: a reload racing
    /// with that read makes the session be checked again (`force`).
    pub generation: u64,
    pub peer: Option<SocketAddr>,
    /// Our address on the connection when it is known without asking the
    /// kernel (a listener bound to one address, not a wildcard).
    pub local: Option<SocketAddr>,
    pub slot: Slot,
    /// The receive timeout the socket has from its listener (Linux copies
    /// SO_RCVTIMEO into each accepted socket), if the acceptor set one.
    pub read_timeout: Option<std::time::Duration>,
}

pub struct Client {
    /// The session's entry in the live registry. Declared before `cli`:
    /// it is dropped (and forgets the socket) before the socket closes.
    pub live: crate::live::Registration,
    pub cli: Stream,
    pub srv: Option<Stream>,
    /// %C %c: the client (or what a PROXY header said it is).
    pub client_addr: Option<SocketAddr>,
    /// %i: the address the client connected to.
    pub local_addr: Option<SocketAddr>,
    /// %e: our source address towards the server.
    pub ext_addr: Option<SocketAddr>,
    /// `ext_addr` is our address on `srv`, asked of the kernel only when a
    /// record is written (a getsockname() less per session without a log).
    pub ext_from_srv: bool,
    /// %R %r: the server we are connected to.
    pub remote_addr: Option<SocketAddr>,
    /// %Q %q: the destination asked for.
    pub req_addr: Option<SocketAddr>,
    /// %n: the destination host name, when one was given.
    pub req_host: Option<String>,
    pub user: Option<String>,
    /// What the record being built carries of its own (text, result,
    /// bytes, start) and whether it is still to be written.
    pub record: Record,
    pub hops: u32,
    /// %N when it is not the service's own name (SOCKS prints the
    /// protocol version the client spoke: SOCK4, SOCK5, SOC45).
    pub service_name: Option<&'static str>,
    /// The PROXY protocol header (`-H`) has been taken off `cli`.
    pub header_read: bool,
    /// The reload generation `svc` belongs to (see [`Accepted`]).
    pub generation: u64,
    /// The client came through a local redirection (3proxy's
    /// `param->redirected`): the ACL skips entries that redirect locally.
    pub redirected: bool,
    /// Hops the local redirections so far took (`%h` before the current
    /// handler's own chain).
    pub local_hops: u32,
    /// `transparent`: the destination netfilter redirected the client
    /// away from, once [`Client::original_dst`] found one.
    pub orig_dst: Option<SocketAddr>,
    /// The mail protocol whose STARTTLS the client has already asked for
    /// (pop3p, imapp and smtpp hand such a client to tlspr, which then
    /// negotiates STARTTLS with the server only).
    pub starttls: Option<StartTls>,
    /// Bytes of the records written so far (the live entry's counters
    /// are set to them plus the current record's at each record).
    recorded: (u64, u64),
    /// A record with the code of an end from outside was written.
    end_recorded: bool,
    /// The `connlim` slots the connection took when it was accepted
    /// (`access::hold_connlim`); boxed: most cfgs have none.
    pub conn_hold: Option<Box<crate::limit::ConnHold>>,
    /// `log radius`: the accounting session of the current record, from
    /// its Start (when access was granted) to its Stop (the record).
    /// Boxed, as `handoff`: rare, and a parked client keeps its
    /// `Client` (an idle client's memory, issue 19).
    pub acct: Option<Box<crate::radius::Accounting>>,
    /// A hand-off the current handler asked for ([`Client::hand_over`]);
    /// its entry point returns it ([`Client::next`]).
    handoff: Option<Box<Handoff>>,
    /// The session went quiet and left the rest of it here to be parked
    /// (`park`): the handlers return as if done, and the client thread
    /// parks the client instead of dropping it ([`Tail`]).
    pub parked: Option<Box<dyn Tail>>,
    /// The receive timeout `cli` has had since it was accepted (inherited
    /// from the listener, see `acceptor`), for the first handler to take
    /// (`Option::take`) and trust: it is known only until something sets
    /// another. Cleared at a hand-off.
    pub cli_read_timeout: Option<std::time::Duration>,
    svc: Arc<Service>,
    /// Counts the client against `maxconn` until dropped.
    _slot: Slot,
}

/// The rest of a session that parked: what it owns besides the `Client`
/// (the server socket, the relay's state, its limits), what to wait for,
/// and how to go on.
pub trait Tail: Send {
    /// The sockets to wait on, `cli` (the client's) among them if it is
    /// to be watched.
    fn fds<'a>(&'a self, cli: &'a Stream) -> Vec<std::os::fd::BorrowedFd<'a>>;
    /// When to go on even if no socket is ready.
    fn deadline(&self) -> Instant;
    /// The reload generation the session was last checked against.
    fn generation(&self) -> u64;
    /// Go on with the session on the current thread; it may park again
    /// (set `c.parked`) only if `how.may_park`. What the handler that
    /// parked would have returned: a hand-off, or done.
    fn resume(self: Box<Self>, c: &mut Client, how: Resumed) -> Next;
}

/// How a parked session comes back to a thread.
#[derive(Clone, Copy, Debug)]
pub struct Resumed {
    /// It may park again (not when the lot could not take it).
    pub may_park: bool,
    /// One of its sockets became ready (not its deadline, nor a reload's
    /// recheck): a thread need not ask whether the client sent anything.
    pub ready: bool,
}

/// A client thread's work on a client (`services::child`): serve a new
/// one (None), or carry on with a session back from the parking lot
/// (its rest, and whether it may park again).
pub type Serve = fn(&mut Client, Option<(Box<dyn Tail>, Resumed)>);

// A parked client moves to the lot's thread and on to another client
// thread.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Client>();
};

/// A mail protocol with STARTTLS (3proxy's S_POP3P, S_IMAPP, S_SMTPP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartTls {
    Pop3,
    Imap,
    Smtp,
}

impl Client {
    pub fn accepted(a: Accepted) -> Client {
        let local_addr = a.local.or_else(|| a.stream.local_addr());
        a.svc.metrics.accepted();
        let start = SystemTime::now();
        // Counted against its slot's service: that is whose slot a
        // reclaim frees.
        let guard = crate::live::Guard {
            key: Arc::as_ptr(&a.slot.0) as usize,
            ..a.svc.guard
        };
        let live = crate::live::register(
            a.svc.def.name,
            a.svc.port(),
            a.peer,
            &a.stream,
            start,
            guard,
        );
        Client {
            live,
            cli: a.stream,
            srv: None,
            client_addr: a.peer,
            local_addr,
            ext_addr: None,
            ext_from_srv: false,
            remote_addr: None,
            req_addr: None,
            req_host: None,
            user: None,
            record: Record::new(start),
            hops: 0,
            service_name: None,
            header_read: false,
            generation: a.generation,
            redirected: false,
            local_hops: 0,
            orig_dst: None,
            starttls: None,
            recorded: (0, 0),
            end_recorded: false,
            conn_hold: None,
            acct: None,
            handoff: None,
            parked: None,
            cli_read_timeout: a.read_timeout,
            svc: a.svc,
            _slot: a.slot,
        }
    }

    pub fn svc(&self) -> &Arc<Service> {
        &self.svc
    }

    /// `transparent` (TransparentPlugin): where a client that netfilter
    /// sent to us meant to go. An iptables/nftables REDIRECT or DNAT
    /// leaves it in conntrack (`SO_ORIGINAL_DST`); a TPROXY rule leaves
    /// the socket's own address as it (our listener does not have that
    /// address or port). None when the service is not transparent or the
    /// client came straight to us: then the service works as usual, as
    /// 3proxy's plugin leaves such a client alone. %i becomes the real
    /// address the client reached.
    pub fn original_dst(&mut self) -> Option<SocketAddr> {
        if !self.svc.transparent {
            return None;
        }
        let local = self.cli.local_addr()?;
        let canon = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
        let local = canon(local);
        self.local_addr = Some(local);
        let found = match self.cli.original_dst().map(canon) {
            // A NAT rule changed the destination.
            Some(o) if o != local => Some(o),
            // No NAT: TPROXY, if the address is not the listener's.
            _ => match &self.svc.listen {
                crate::net::Addr::Ip(l) => {
                    let l = canon(*l);
                    let other_ip = !l.ip().is_unspecified() && l.ip() != local.ip();
                    (l.port() != local.port() || other_ip).then_some(local)
                }
                _ => None,
            },
        };
        self.orig_dst = found;
        found
    }

    /// Whether connecting to `dst` would reach this very service: its
    /// listening address, or the address the client reached (except the
    /// TPROXY destination, which is not ours).
    pub fn is_self(&self, dst: SocketAddr) -> bool {
        crate::net::Addr::Ip(dst) == self.svc.listen
            || (Some(dst) == self.local_addr && self.orig_dst != Some(dst))
    }

    /// Hand the client to the handler of `h.kind` once the current one
    /// returns (a local redirection). Err NOTIMPL for a handler that takes
    /// no TCP client (`dns`): nothing is recorded.
    pub fn hand_over(&mut self, h: Handoff) -> Result<(), Res> {
        parent::check_handoff(&h)?;
        self.handoff = Some(Box::new(h));
        Ok(())
    }

    /// What the current handler leaves to do: the hand-off it asked for,
    /// or nothing. A service's entry point returns this.
    pub fn next(&mut self) -> Next {
        match self.handoff.take() {
            Some(h) => Next::Handoff(*h),
            None => Next::Done,
        }
    }

    /// A request to the access layer with what the client itself tells:
    /// its address, the address it reached us on, and whether it came
    /// through a local redirection. Services add the rest:
    /// `Request { host, addr, port, ..c.request(op) }`.
    pub fn request(&self, op: Op) -> Request<'static> {
        Request {
            op: Some(op),
            client: self.client_addr,
            local: self.local_addr,
            redirected: self.redirected,
            service: Some(self.service_name.unwrap_or(self.svc.def.log_name)),
            connlim_early: self.conn_hold.as_ref().map(|h| h.mark()),
            ..Request::default()
        }
    }
}

impl Client {
    /// Tell the live registry what the session knows now: its user, the
    /// destination asked for and the first parent. Allocates only what
    /// changed.
    pub fn publish(&self) {
        let parent = if self.hops > self.local_hops {
            self.remote_addr
        } else {
            None
        };
        self.live.update(
            self.client_addr,
            self.user.as_deref(),
            self.req_host.as_deref(),
            self.req_addr,
            parent,
        );
    }

    /// End the record being built: write it (unless a `nolog` grant
    /// covers it) and begin the next one. An HTTP client writes one
    /// record per request this way, ftppr one per data transfer, SOCKS
    /// UDP one per destination; the drop writes the last if it is open.
    pub fn end_record(&mut self) {
        if !self.record.nolog {
            self.write_record();
        }
        self.record.next();
    }

    /// End the record being built without writing it (an `ssl_mitm`
    /// tunnel whose requests write their own, an FTP session with
    /// nothing to say): the next one begins, and the drop writes nothing
    /// unless something opens it again.
    pub fn drop_record(&mut self) {
        self.record.next();
    }

    fn write_record(&mut self) {
        if let Some(by) = self.live.ended_by() {
            // Ended from outside: the session saw its sockets shut down
            // (an EOF, or an error of either side); the record says who
            // ended it.
            self.record.res = ended_res(by);
            self.end_recorded = true;
        }
        self.recorded.0 += self.record.bytes_out;
        self.recorded.1 += self.record.bytes_in;
        self.live.set_bytes(self.recorded.0, self.recorded.1);
        let (out, inb) =
            self.corrected(self.record.bytes_out, self.record.bytes_in, self.record.ops);
        // The counters take the record's bytes now (unless the session
        // still holds its limits).
        self.record.limits = None;
        if self.logs_radius() && self.radius_log().is_some() {
            // `log radius`: the record is the session's Stop.
            let acct = self.acct.take();
            if let Some(t) = acct.as_ref().and_then(|s| s.track.as_ref()) {
                t.stop();
                self.live.set_tag(None);
            }
            self.account(Status::Stop, acct.as_deref(), out, inb);
            return;
        }
        let r = &self.record;
        self.write_record_as(r.res, out, inb, r.start);
    }

    /// The bytes (out, in) a record of `out` and `in` bytes, with the
    /// server's reads, writes and connects `ops`, says: as the service's
    /// TrafficPlugin rules correct them (the counters of the record's
    /// grant take the difference), or as they are.
    #[inline]
    fn corrected(&self, out: u64, inb: u64, ops: crate::traffic::Ops) -> (u64, u64) {
        match &self.svc.traffic {
            None => (out, inb),
            Some(rules) => self.correct_by(rules, out, inb, ops),
        }
    }

    #[inline(never)]
    fn correct_by(
        &self,
        rules: &crate::traffic::Rules,
        out: u64,
        inb: u64,
        ops: crate::traffic::Ops,
    ) -> (u64, u64) {
        let seen = crate::traffic::Seen {
            service: self.service_name.unwrap_or(self.svc.def.log_name),
            port: self.remote_addr.map(|a| a.port()),
            datagram: self.record.datagram,
            ops,
        };
        let now = rules.apply(&seen, out, inb);
        if let Some(l) = &self.record.limits {
            l.recount((inb, out), (now.1, now.0));
        }
        now
    }

    /// A `logdump` record of the bytes and the server's reads and writes
    /// since the last one, while the relay runs.
    pub fn write_dump(&self, out: u64, inb: u64, ops: crate::traffic::Ops, start: SystemTime) {
        let (out, inb) = self.corrected(out, inb, ops);
        self.write_record_as(Res::OK, out, inb, start);
    }

    /// The servers of `log radius`, when the session logs there.
    fn radius_log(&self) -> Option<&Arc<crate::radius::Conf>> {
        if self.logs_radius() {
            self.svc.policy().radius.get()
        } else {
            None
        }
    }

    /// The service's log is `log radius` (a check of one pointer and a
    /// tag: it runs at every record).
    #[inline]
    fn logs_radius(&self) -> bool {
        matches!(self.svc.log.as_deref(), Some(crate::log::Sink::Radius))
    }

    /// Access was granted for the record being built: `log radius` sends
    /// its Start ([`Client::acct_start`]); with TrafficPlugin rules the
    /// record keeps the grant's limits, whose counters take its corrected
    /// bytes.
    pub fn granted(&mut self, grant: &crate::access::Grant) {
        if self.svc.traffic.is_some() && !grant.nolog {
            self.record.limits.clone_from(&grant.limits);
        }
        self.acct_start(grant);
    }

    /// `log radius`: access was granted; send the Start of the session's
    /// record (once per record), with what the grant gave it. A `nolog`
    /// grant has no record, so no Start either.
    #[inline]
    pub fn acct_start(&mut self, grant: &crate::access::Grant) {
        if self.logs_radius() {
            self.acct_start_radius(grant);
        }
    }

    #[inline(never)]
    fn acct_start_radius(&mut self, grant: &crate::access::Grant) {
        if grant.nolog || self.acct.is_some() || self.radius_log().is_none() {
            return;
        }
        let now = SystemTime::now();
        let r = grant.radius.as_deref();
        let mut session = crate::radius::Accounting {
            id: r.map_or_else(
                || crate::radius::SessionId::new(now),
                |r| crate::radius::SessionId::from_text(&r.session_id),
            ),
            key: crate::radius::next_key(),
            since: now,
            class: r.map(|r| r.class.clone()).unwrap_or_default(),
            dumped_in: Default::default(),
            dumped_out: Default::default(),
            track: None,
        };
        self.account(Status::Start, Some(&session), 0, 0);
        if let Some(conf) = self.radius_log() {
            // `radiusinterim`'s timer and `radiusdae` find the session by
            // its live entry's tag.
            // The live counters at the start of this record.
            let base = self.recorded;
            let fields = || self.acct_fields(session.id);
            let t = Arc::new(crate::radius::Track::new(conf, &session, fields, base));
            self.live.set_tag(Some(t.clone()));
            session.track = Some(t);
        }
        self.acct = Some(Box::new(session));
    }

    /// The relay is about to start: the live counters take what the
    /// session counted itself so far (a CONNECT's answer), so the relay's
    /// deliveries add up to what the record will say.
    pub fn sync_live(&self) {
        self.live.set_bytes(
            self.recorded.0 + self.record.bytes_out,
            self.recorded.1 + self.record.bytes_in,
        );
    }

    /// `radiusinterim`: the session reached its destination; its
    /// Interim-Updates say what its Stop will.
    pub fn acct_refresh(&self) {
        let track = self.acct.as_ref().and_then(|s| s.track.as_ref());
        if let Some(t) = track.filter(|t| t.interim()) {
            t.set_fields(self.acct_fields(t.session_id));
        }
    }

    /// Queue an Accounting-Request for the current record: `out` and
    /// `inb` are the bytes since the last Interim-Update. Without a
    /// session (a refused request), a Stop gets an id of its own, as
    /// 3proxy sends a Stop for every record.
    fn account(&self, status: Status, s: Option<&crate::radius::Accounting>, out: u64, inb: u64) {
        let Some(conf) = self.radius_log() else {
            return;
        };
        let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let (input, output) = s.map_or((inb, out), |s| {
            (ld(&s.dumped_in) + inb, ld(&s.dumped_out) + out)
        });
        let since = s.map_or(self.record.start, |s| s.since);
        let id = s.map_or_else(
            || crate::radius::SessionId::new(self.record.start),
            |s| s.id,
        );
        let r = crate::radius::Record {
            status,
            fields: self.acct_view(&id),
            input,
            output,
            session_time: since.elapsed().map_or(0, |d| d.as_secs()),
            class: s.map_or(&[], |s| &s.class[..]),
            res: self.record.res,
        };
        crate::radius::account(conf, s.map_or(0, |s| s.key), &r);
    }

    /// What accounting requests tell about this client, borrowed.
    fn acct_view<'a>(&'a self, id: &'a crate::radius::SessionId) -> crate::radius::View<'a> {
        crate::radius::View {
            user: self.user.as_deref(),
            client: self.client_addr,
            local: self.local_addr,
            nas_port: self.svc.port(),
            nas_id: self.service_name.unwrap_or(self.svc.def.log_name),
            host: self.req_host.as_deref(),
            dst: self.req_addr.map(|a| a.ip()),
            port: self.req_addr.map_or(0, |a| a.port()),
            op: None,
            session_id: id.as_bytes(),
        }
    }

    /// The same, owned (what a `radiusinterim` track keeps).
    fn acct_fields(&self, id: crate::radius::SessionId) -> crate::radius::Fields {
        let v = self.acct_view(&id);
        crate::radius::Fields {
            user: v.user.map(str::to_string),
            client: v.client,
            local: v.local,
            nas_port: v.nas_port,
            nas_id: v.nas_id.to_string(),
            host: v.host.map(str::to_string),
            dst: v.dst,
            port: v.port,
            op: None,
            session_id: id.as_str().to_string(),
        }
    }

    /// A record with this session's fields but the given result, byte
    /// counts and start: `logdump`'s intermediate records, written while
    /// the relay holds the sockets. With `log radius`, an Interim-Update.
    #[inline]
    pub fn write_record_as(&self, res: Res, bytes_out: u64, bytes_in: u64, start: SystemTime) {
        self.svc
            .metrics
            .record(res, bytes_out, bytes_in, self.user.as_deref());
        if let Some(sink) = &self.svc.log {
            self.emit_record(sink, res, bytes_out, bytes_in, start);
        }
    }

    /// [`Client::write_record_as`]'s log record (a service without a log
    /// has none: this stays out of its path).
    #[inline(never)]
    fn emit_record(
        &self,
        sink: &Arc<crate::log::Sink>,
        res: Res,
        bytes_out: u64,
        bytes_in: u64,
        start: SystemTime,
    ) {
        let svc = &self.svc;
        if let Some(conf) = self.radius_log() {
            if let Some(s) = &self.acct {
                let input = s.dumped_in.fetch_add(bytes_in, Ordering::Relaxed) + bytes_in;
                let output = s.dumped_out.fetch_add(bytes_out, Ordering::Relaxed) + bytes_out;
                let r = crate::radius::Record {
                    status: Status::InterimUpdate,
                    fields: self.acct_view(&s.id),
                    input,
                    output,
                    session_time: s.since.elapsed().map_or(0, |d| d.as_secs()),
                    class: &s.class,
                    res: Res::OK,
                };
                crate::radius::account(conf, s.key, &r);
            }
            return;
        }
        let rec = LogRecord {
            service: self.service_name.unwrap_or(svc.def.log_name),
            listen_port: svc.port(),
            res: res.0,
            user: self.user.as_deref(),
            client: self.client_addr,
            local: self.local_addr,
            ext: self.ext_addr.or_else(|| {
                self.ext_from_srv
                    .then(|| self.srv.as_ref().and_then(Stream::local_addr))
                    .flatten()
            }),
            remote: self.remote_addr,
            req: self.req_addr,
            req_host: self.req_host.as_deref(),
            bytes_in,
            bytes_out,
            hops: self.hops,
            text: &self.record.text,
            start,
            now: SystemTime::now(),
        };
        crate::log::emit(sink, &svc.logformat, &rec);
    }
}

/// The code of a session ended from outside, by why.
fn ended_res(by: crate::live::EndedBy) -> Res {
    use crate::live::EndedBy;
    match by {
        EndedBy::Admin => Res::ENDED,
        EndedBy::Reclaim => Res::RECLAIMED,
        EndedBy::Slow => Res::TOO_SLOW,
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if !self.record.open
            && !self.end_recorded
            && matches!(
                self.live.ended_by(),
                Some(crate::live::EndedBy::Reclaim | crate::live::EndedBy::Slow)
            )
        {
            // Closed between two requests for its slot (or its next head
            // was too slow) after its last record: the close has a record
            // of its own, with its code.
            self.record.begin();
        }
        if self.record.open && !self.record.nolog {
            self.write_record();
        }
        self.svc.metrics.ended();
        // `live` is dropped next (it is declared first): the session
        // leaves the registry, forgetting its sockets before they close.
    }
}
