//! threeproxy::fuzzing::dns_proxy under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| threeproxy::fuzzing::dns_proxy(data));
