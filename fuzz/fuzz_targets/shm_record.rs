//! Fuzz the shared-memory ring's record decoder, `ictus_shm::record::scan`, on ring
//! images: wild heads and tails, headers of any kind, lengths and sequence numbers,
//! pads and pool references. Besides never panicking, every record accepted must lie
//! inside the ring, every pool reference inside the pool, and no slot be handed out
//! twice (`ictus_shm::record::fuzz_scan` checks it; the seeds in corpus/shm_record are
//! replayed on stable by crates/shm/tests/fuzz_corpus.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ictus_shm::record::fuzz_scan(data);
});
