//! The services that are serving, keyed by what their listening socket is,
//! so a reload can keep a listener whose address and options did not
//! change (no gap, no second listener, no lost queued connection) and only
//! swap the settings behind it.
//!
//! Each acceptor (or UDP loop) thread owns its socket and reads the
//! `current` service snapshot for every new client; clients already being
//! served keep the snapshot they started with. Stopping a service sets its
//! flag and shuts its socket down, which wakes the blocked accept().

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::services::Service;

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

/// Bumped by every reload that took effect; relays compare it with the
/// value they started with to know when to check their session again.
static GENERATION: AtomicU64 = AtomicU64::new(0);

pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// A reload took effect.
pub fn bump_generation() {
    // Release: whoever reads the new value also sees the swapped settings.
    GENERATION.fetch_add(1, Ordering::Release);
}

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
