//! threeproxy::fuzzing::tls_hello under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| threeproxy::fuzzing::tls_hello(data));
