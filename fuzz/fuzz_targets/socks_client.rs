//! threeproxy::fuzzing::socks_client under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| threeproxy::fuzzing::socks_client(data));
