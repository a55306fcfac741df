//! Integration tests for the `3proxy` binary.
//!
//! Every test runs the real binary on a cfg written to its own temp dir, on
//! 127.0.0.1 (or ::1, or a unix socket) with ports picked by binding `:0`,
//! and talks to it through real sockets. Origins are threads in the test.
//! The harness is in `util.rs`; each other module covers one area.

mod util;

mod acl;
mod admin;
mod conf;
mod connectback;
mod crypt;
mod dnspr;
mod failover;
mod faults;
mod ftpgw;
mod ftppr;
mod fuzz_corpus;
mod http;
mod imapp;
mod install;
mod layers;
mod ldap;
mod lenient;
mod log;
mod metrics;
mod mitm;
mod ops;
mod options;
mod parent;
mod park;
mod pcre;
mod plugins;
mod pop3p;
mod pressure;
mod process;
mod radius;
mod redirect_local;
mod reload;
mod resolve;
mod sample;
mod services;
mod smtpp;
mod smuggle;
mod soak;
mod socks;
mod sqllog;
mod sslcli;
mod standalone;
mod starttls;
mod strings;
mod tcppm;
mod tls;
mod traffic;
mod udppm;
