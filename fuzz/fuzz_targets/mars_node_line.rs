//! Fuzz the MARS cluster's line protocol: what a node tells the director
//! (`HELLO … MAC`/`BEAT`/`OPEN`) and what the director tells a node
//! (`NONCE`/`WELCOME`/`REFUSED`). Parse untrusted bytes; the checks are
//! `ictus_mars_cluster::wire::fuzz_line`'s (anything accepted reads back the same; a
//! HELLO's MAC verifies only for its key, nonce and fields).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ictus_mars_cluster::wire::fuzz_line(data));
