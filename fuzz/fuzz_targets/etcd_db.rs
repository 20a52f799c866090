//! Fuzz target `etcd_db`: see `ephd_fuzz` (ephd-fuzz/src/) for what it does
//! and checks; the replay test there runs the same code on the seeds and on
//! every crash found.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ephd_fuzz::run("etcd_db", data));
