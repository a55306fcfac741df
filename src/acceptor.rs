//! One acceptor thread per TCP service (3proxy's `proxymain.c` main loop).
//!
//! The loop: wait while the service has `maxconn` live clients (new clients
//! then queue in the kernel's backlog, as with 3proxy), accept one, set its
//! socket options, and hand it to a client thread. Client threads are kept:
//! one that has finished its client waits a while on a channel for the next
//! (the channel has no capacity, so a hand-off succeeds only when a thread
//! is already waiting); when none is waiting, a new thread is started with
//! the service's small stack. That saves a thread start per connection
//! without changing the model: still one client per thread at a time.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

use crate::client::Client;
use crate::net::{Listener, Stream};
use crate::running::Running;
use crate::services::{Kind, Service};

/// How long a finished client thread waits for the next client before it
/// exits and frees its stack.
const IDLE_THREAD: Duration = Duration::from_secs(15);
/// Least time between two "too many connected clients" warnings.
const WARN_EVERY: Duration = Duration::from_secs(5);

/// A live-client slot of a service. Dropping it frees the slot and wakes
/// the acceptor if it was waiting at `maxconn`, so a client that ends by
/// any path (return, error, panic) always gives its slot back.
pub struct Slot(Arc<Service>);

impl Slot {
    /// Take a slot, waiting while the service is full. Gives up (None)
    /// after a second so the acceptor can notice a reload or a stop.
    fn take(svc: &Arc<Service>, last_warn: &mut Option<Instant>) -> Option<Slot> {
        let mut live = svc.live.lock().unwrap_or_else(|e| e.into_inner());
        if *live >= svc.maxconn {
            if last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                log::warn!(
                    "{} on {}: too many connected clients ({}/{}), new ones wait",
                    svc.def.name,
                    svc.listen,
                    *live,
                    svc.maxconn
                );
                *last_warn = Some(Instant::now());
            }
            let (l, _) = svc
                .left
                .wait_timeout_while(live, Duration::from_secs(1), |n| *n >= svc.maxconn)
                .unwrap_or_else(|e| e.into_inner());
            live = l;
            if *live >= svc.maxconn {
                return None;
            }
        }
        *live += 1;
        crate::shutdown::session_started();
        Some(Slot(svc.clone()))
    }

    pub fn service(&self) -> &Arc<Service> {
        &self.0
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut live = self.0.live.lock().unwrap_or_else(|e| e.into_inner());
        *live -= 1;
        drop(live);
        crate::shutdown::session_ended();
        self.0.left.notify_one();
    }
}

/// An accepted client on its way to a client thread.
pub struct Accepted {
    pub stream: Stream,
    pub peer: Option<SocketAddr>,
    pub slot: Slot,
}

/// The acceptor thread's body: runs until the service is stopped (by a
/// reload that drops it, or at exit), then closes the listener.
pub fn run(r: Arc<Running>, listener: Listener) {
    let first = r.current();
    let Kind::Tcp(serve) = first.def.kind else {
        return;
    };
    if !first.opts.silent {
        svc_record(&first, "Accepting connections");
    }
    drop(first);
    let (tx, rx) = bounded::<Accepted>(0);
    let mut last_warn = None;
    let mut last_err: Option<Instant> = None;
    while !r.stopped() {
        // The settings of the moment: a reload may have swapped them.
        let svc = r.current();
        let Some(slot) = Slot::take(&svc, &mut last_warn) else {
            continue;
        };
        let (stream, peer) = match listener.accept() {
            Ok(x) => x,
            Err(e) => {
                drop(slot);
                if !r.stopped() {
                    accept_error(&svc, &e, &mut last_err);
                }
                continue;
            }
        };
        // TCP_NODELAY by default: a proxy must not add Nagle's delay to
        // small writes; `-oc` options come on top.
        stream.set_nodelay();
        svc.opts.oc.apply(std::os::fd::AsFd::as_fd(&stream));
        dispatch(&svc, &tx, &rx, serve, Accepted { stream, peer, slot });
    }
    let svc = r.current();
    if !svc.opts.silent {
        svc_record(&svc, "Exiting thread");
    }
}

/// The body of a `-r` (connect-back) service's thread, in place of the
/// accept loop: within `maxconn`, dial the `-R` side, wait for its `C`,
/// and hand the connection to a client thread as if it had been accepted
/// (see `crate::connectback`). A failed dial is retried after a pause that
/// grows to a second, so a relay that is down is not hammered.
pub fn run_dialing(r: Arc<Running>, wake: crate::connectback::Wake) {
    let first = r.current();
    let Kind::Tcp(serve) = first.def.kind else {
        return;
    };
    let Some(to) = first.opts.connect_to else {
        return;
    };
    drop(first);
    let (tx, rx) = bounded::<Accepted>(0);
    let mut last_warn = None;
    let mut pause = Duration::from_millis(10);
    while !r.stopped() {
        let svc = r.current();
        let Some(slot) = Slot::take(&svc, &mut last_warn) else {
            continue;
        };
        match crate::connectback::dial(&svc, to, &wake) {
            Ok((stream, peer)) => {
                pause = Duration::from_millis(10);
                dispatch(&svc, &tx, &rx, serve, Accepted { stream, peer, slot });
            }
            Err(crate::connectback::DialError::Stopped) => break,
            Err(crate::connectback::DialError::Failed(why)) => {
                drop(slot);
                log::debug!("{} -r{to}: {why}", svc.def.name);
                wake.sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
    let svc = r.current();
    if !svc.opts.silent {
        svc_record(&svc, "Exiting thread");
    }
}

/// Hand a client to a waiting thread, or start one.
fn dispatch(
    svc: &Arc<Service>,
    tx: &Sender<Accepted>,
    rx: &Receiver<Accepted>,
    serve: fn(&mut Client),
    job: Accepted,
) {
    let job = match tx.try_send(job) {
        Ok(()) => return,
        Err(TrySendError::Full(j) | TrySendError::Disconnected(j)) => j,
    };
    let rx = rx.clone();
    // The job moves into the closure; if the spawn fails the closure is
    // dropped with it, which closes the client and frees its slot.
    let spawned = std::thread::Builder::new()
        .name(format!("{}:{}", svc.def.name, svc.port()))
        .stack_size(svc.stack_size)
        .spawn(move || client_thread(job, rx, serve));
    if let Err(e) = spawned {
        log::error!(
            "{} on {}: cannot start a client thread: {e}",
            svc.def.name,
            svc.listen
        );
    }
}

fn client_thread(first: Accepted, rx: Receiver<Accepted>, serve: fn(&mut Client)) {
    let mut job = first;
    loop {
        {
            let mut client = Client::accepted(job);
            serve(&mut client);
        }
        match rx.recv_timeout(IDLE_THREAD) {
            Ok(next) => job = next,
            Err(_) => return,
        }
    }
}

/// accept() failed. Running out of descriptors or memory is transient:
/// back off briefly so the loop does not spin, and log at most once a
/// second so a flood does not fill the disk.
fn accept_error(svc: &Service, e: &io::Error, last: &mut Option<Instant>) {
    let transient = matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    );
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
        log::error!("{} on {}: accept(): {e}", svc.def.name, svc.listen);
        *last = Some(Instant::now());
    }
    if transient {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A service event record ("Accepting connections ...") in the access log,
/// as 3proxy writes one when a service starts.
pub fn svc_record(svc: &Service, what: &str) {
    let Some(sink) = &svc.log else { return };
    let text = format!("{what} [{}/{}]", std::process::id(), thread_id());
    let now = std::time::SystemTime::now();
    let listen = match &svc.listen {
        crate::net::Addr::Ip(a) => Some(*a),
        _ => None,
    };
    let rec = crate::logformat::LogRecord {
        listen_port: svc.port(),
        client: listen,
        local: listen,
        text: &text,
        ..crate::logformat::LogRecord::blank(svc.def.log_name, now)
    };
    crate::log::emit(sink, &svc.logformat, &rec);
}

fn thread_id() -> i32 {
    nix::unistd::gettid().as_raw()
}
