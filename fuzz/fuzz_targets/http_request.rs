//! threeproxy::fuzzing::http_request under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| threeproxy::fuzzing::http_request(data));
