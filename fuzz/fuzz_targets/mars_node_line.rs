//! Fuzz the MARS cluster's node line protocol (`HELLO`/`BEAT`/`OPEN`, what a node tells
//! the director): parse untrusted bytes; the checks are
//! `ictus_mars_cluster::wire::fuzz_line`'s.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ictus_mars_cluster::wire::fuzz_line(data));
