//! threeproxy::fuzzing::socks_server under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| threeproxy::fuzzing::socks_server(data));
