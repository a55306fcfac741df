//! The services that are serving, keyed by what their listening socket is,
//! so a reload can keep a listener whose address and options did not
//! change (no gap, no second listener, no lost queued connection) and only
//! swap the settings behind it.
//!
//! Each acceptor (or UDP loop) thread owns its socket and reads the
//! `current` service snapshot for every new client; clients already being
//! served keep the snapshot they started with. Stopping a service sets its
//! flag and shuts its socket down, which wakes the blocked accept().

use std::net::UdpSocket;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::access::Recheck;
use crate::net::Listener;
use crate::res::Res;
use crate::service::Service;

/// One serving socket and the snapshot new clients get.
pub struct Running {
    /// What identifies the socket across reloads (see `services::listen_key`).
    pub key: String,
    current: Mutex<Arc<Service>>,
    stop: AtomicBool,
    /// A duplicate of the socket, kept to wake the thread when stopping.
    wake: Option<OwnedFd>,
}

impl Running {
    pub fn new(key: String, svc: Arc<Service>, sock: &impl AsFd) -> Running {
        Running {
            key,
            current: Mutex::new(svc),
            stop: AtomicBool::new(false),
            wake: sock.as_fd().try_clone_to_owned().ok(),
        }
    }

    /// The snapshot for the next client.
    pub fn current(&self) -> Arc<Service> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Serve new clients with `svc` from now on.
    pub fn swap(&self, svc: Arc<Service>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = svc;
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Stop accepting: the thread closes its socket and exits.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(fd) = &self.wake {
            // shutdown() acts on the socket, not the descriptor: the blocked
            // accept() (or recv) in the owning thread returns at once.
            let _ = socket2::SockRef::from(fd).shutdown(std::net::Shutdown::Both);
        }
    }
}

static REGISTRY: Mutex<Vec<Arc<Running>>> = Mutex::new(Vec::new());

pub use crate::generation::{bump_generation, generation};

/// The settings now serving the socket with this key, if it still runs.
pub fn current(key: &str) -> Option<Arc<Service>> {
    let reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    reg.iter().find(|r| r.key == key).map(|r| r.current())
}

/// Every serving socket.
pub fn all() -> Vec<Arc<Running>> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

pub fn register(r: Arc<Running>) {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner()).push(r);
}

/// Stop and forget the services for which `keep` is false.
pub fn retain(keep: impl Fn(&Running) -> bool) {
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    reg.retain(|r| {
        if keep(r) {
            true
        } else {
            r.stop();
            false
        }
    });
}

/// Stop every service (process exit).
pub fn stop_all() {
    retain(|_| false);
}

/// Check a session again against the settings now serving its listener
/// (`force`, after a reload). A listener the reload removed leaves the
/// session alone.
pub fn recheck(r: &Recheck) -> Result<(), Res> {
    match current(r.key()) {
        Some(now) => r.check_against(&*now),
        None => Ok(()),
    }
}

/// A service ready to start: its settings and its socket.
pub struct Prepared {
    pub svc: Arc<Service>,
    /// A new socket; None in check mode (`-t`, which binds nothing) and
    /// when a running socket is reused.
    pub socket: Option<Bound>,
    /// On reload: the serving socket with the same key, kept open.
    pub reuse: Option<Arc<Running>>,
    /// Identifies the socket across reloads.
    pub key: String,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on {}", self.svc.def.name, self.svc.listen)
    }
}

/// The socket a service receives on.
pub enum Bound {
    Stream(Listener),
    Datagram(UdpSocket),
    /// `-r`: no socket to listen on; the service dials out.
    Dial(crate::connectback::Wake),
}
