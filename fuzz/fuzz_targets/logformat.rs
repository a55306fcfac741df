//! threeproxy::fuzzing::logformat under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| threeproxy::fuzzing::logformat(data));
