//! threeproxy: a drop-in replacement for the 3proxy proxy server.
//!
//! The crate is a library so that the fuzz targets (`fuzz/`) and the
//! corpus replay test can call the parsers; the program is `src/main.rs`,
//! which only calls [`main`] (the command line is `cli`). Everything else
//! stays private: what fuzzing needs is the [`fuzzing`] facade.
//!
//! The code map, the layers and the invariants are in ARCHITECTURE.md
//! (and, short, in the README).
#![deny(unsafe_code)]

// The module tree, in one alphabetical list.
mod acceptor;
mod access;
mod acl;
mod addr;
mod auth;
mod bufpool;
mod chain;
mod charset;
mod cli;
mod client;
mod conf;
mod connectback;
mod counter_file;
mod crypt;
mod dae;
mod dircount;
mod escape;
mod filter;
pub mod fuzzing;
mod generation;
mod health;
mod limit;
mod live;
mod log;
mod logformat;
mod metrics;
mod net;
mod parent;
mod parentcheck;
mod park;
mod proto;
mod radius;
mod random;
mod relay;
mod res;
mod resolve;
mod running;
mod service;
mod services;
mod session;
mod shutdown;
mod sqllog;
mod stringtable;
mod sys;
mod timeouts;
mod tls;
mod traffic;
mod udprelay;

pub use cli::main;
