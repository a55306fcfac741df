//! threeproxy::fuzzing::cfg under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| threeproxy::fuzzing::cfg(data));
