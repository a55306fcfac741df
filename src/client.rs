//! One client connection's state, from accept to the log line (3proxy's
//! `clientparam`; `freeparam` is our `Drop`).
//!
//! A service's function fills in what it learns (destination, addresses,
//! result code, byte counts); when the `Client` is dropped, by whatever path,
//! its one access-log record is written and its service slot is freed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use crate::acceptor::{Accepted, Slot};
use crate::logformat::LogRecord;
use crate::net::Stream;
use crate::res::Res;
use crate::services::Service;

pub struct Client {
    pub cli: Stream,
    pub srv: Option<Stream>,
    /// %C %c: the client (or what a PROXY header said it is).
    pub client_addr: Option<SocketAddr>,
    /// %i: the address the client connected to.
    pub local_addr: Option<SocketAddr>,
    /// %e: our source address towards the server.
    pub ext_addr: Option<SocketAddr>,
    /// %R %r: the server we are connected to.
    pub remote_addr: Option<SocketAddr>,
    /// %Q %q: the destination asked for.
    pub req_addr: Option<SocketAddr>,
    /// %n: the destination host name, when one was given.
    pub req_host: Option<String>,
    pub user: Option<String>,
    /// %T: the service text.
    pub text: String,
    pub res: Res,
    /// %O: bytes client -> server.
    pub bytes_out: u64,
    /// %I: bytes server -> client.
    pub bytes_in: u64,
    pub hops: u32,
    pub start: SystemTime,
    /// %N when it is not the service's own name (SOCKS prints the
    /// protocol version the client spoke: SOCK4, SOCK5, SOC45).
    pub service_name: Option<&'static str>,
    /// The PROXY protocol header (`-H`) has been taken off `cli`.
    pub header_read: bool,
    /// Set when the last request was logged and nothing happened since:
    /// the drop then writes no second record (HTTP keep-alive).
    pub logged: bool,
    /// The reload generation `svc` belongs to (see [`Accepted`]).
    pub generation: u64,
    svc: Arc<Service>,
    /// Counts the client against `maxconn` until dropped.
    _slot: Slot,
}

impl Client {
    pub fn accepted(a: Accepted) -> Client {
        let local_addr = a.local.or_else(|| a.stream.local_addr());
        Client {
            cli: a.stream,
            srv: None,
            client_addr: a.peer,
            local_addr,
            ext_addr: None,
            remote_addr: None,
            req_addr: None,
            req_host: None,
            user: None,
            text: String::new(),
            res: Res::OK,
            bytes_out: 0,
            bytes_in: 0,
            hops: 0,
            start: SystemTime::now(),
            service_name: None,
            header_read: false,
            logged: false,
            generation: a.generation,
            svc: a.svc,
            _slot: a.slot,
        }
    }

    pub fn svc(&self) -> &Arc<Service> {
        &self.svc
    }
}

impl Client {
    /// Write the access-log record for what happened so far, then reset the
    /// per-record fields (bytes, result, text, start), as 3proxy does after
    /// each record: an HTTP client gets one record per request.
    pub fn log_record(&mut self) {
        self.write_record();
        self.bytes_in = 0;
        self.bytes_out = 0;
        self.res = Res::OK;
        self.text.clear();
        self.start = SystemTime::now();
        self.logged = true;
    }

    fn write_record(&self) {
        self.write_record_as(self.res, self.bytes_out, self.bytes_in, self.start);
    }

    /// A record with this session's fields but the given result, byte
    /// counts and start: `logdump`'s intermediate records, written while
    /// the relay holds the sockets.
    pub fn write_record_as(&self, res: Res, bytes_out: u64, bytes_in: u64, start: SystemTime) {
        let svc = &self.svc;
        let Some(sink) = &svc.log else { return };
        let rec = LogRecord {
            service: self.service_name.unwrap_or(svc.def.log_name),
            listen_port: svc.port(),
            res: res.0,
            user: self.user.as_deref(),
            client: self.client_addr,
            local: self.local_addr,
            ext: self.ext_addr,
            remote: self.remote_addr,
            req: self.req_addr,
            req_host: self.req_host.as_deref(),
            bytes_in,
            bytes_out,
            hops: self.hops,
            text: &self.text,
            start,
            now: SystemTime::now(),
        };
        crate::log::emit(sink, &svc.logformat, &rec);
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if !self.logged {
            self.write_record();
        }
    }
}
