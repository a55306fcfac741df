//! The `3proxy` program: the command line and everything else are in the
//! library (`src/lib.rs`, the command line in `src/cli.rs`).
#![deny(unsafe_code)]

fn main() -> std::process::ExitCode {
    threeproxy::main()
}
