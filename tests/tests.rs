//! Integration tests for the `3proxy` binary.
//!
//! Every test runs the real binary on a cfg written to its own temp dir, on
//! 127.0.0.1 (or ::1, or a unix socket) with ports picked by binding `:0`,
//! and talks to it through real sockets. Origins are threads in the test.
//! The harness is in `util.rs`; each other module covers one area.

mod util;

mod conf;
mod log;
mod process;
mod tcppm;
mod udppm;
mod install;
mod crypt;
mod reload;
mod acl;
mod resolve;
mod http;
mod ops;
mod socks;
mod parent;
mod standalone;
mod options;
mod connectback;
mod sample;
