//! threeproxy::fuzzing::proxy_header under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| threeproxy::fuzzing::proxy_header(data));
