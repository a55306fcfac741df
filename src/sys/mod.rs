//! The only place with `unsafe` and raw libc: socket options by number,
//! and the calls std and nix do not wrap safely. Everything here exposes a
//! safe API; each unsafe block says why it is sound.

mod dl;
pub mod ldap;
pub mod mem;
pub mod pam;
pub mod process;
pub mod signal;
pub mod sockopt;
pub mod thread;
pub mod time;
pub mod udp;
