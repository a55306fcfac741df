//! threeproxy::fuzzing::strings_file under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| threeproxy::fuzzing::strings_file(data));
