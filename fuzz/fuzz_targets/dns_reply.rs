//! threeproxy::fuzzing::dns_reply under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| threeproxy::fuzzing::dns_reply(data));
