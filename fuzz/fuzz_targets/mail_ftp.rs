//! threeproxy::fuzzing::mail_ftp under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| threeproxy::fuzzing::mail_ftp(data));
