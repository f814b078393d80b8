//! Replays the `shm_record` fuzz target's corpus (fuzz/corpus/shm_record) on stable, and
//! checks that the seeds decode as intended.

use std::path::PathBuf;

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/shm_record");
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).expect("read")))
        .collect();
    out.sort();
    out
}

#[test]
fn the_corpus_replays_without_a_broken_promise() {
    let files = corpus();
    assert!(files.len() >= 5, "seeds are missing");
    for (name, data) in &files {
        let r = std::panic::catch_unwind(|| ictus_shm::record::fuzz_scan(data));
        assert!(r.is_ok(), "{name} broke a promise");
    }
    // The seeds say what they are.
    let found: Vec<(String, Option<usize>)> =
        files.iter().map(|(n, d)| (n.clone(), ictus_shm::record::fuzz_scan(d))).collect();
    for (name, want) in [("seed-empty", 0), ("seed-inline", 1), ("seed-pool", 1), ("seed-two", 2), ("seed-wrap", 1)] {
        assert!(found.contains(&(name.to_string(), Some(want))), "{name}: {found:?}");
    }
}

#[test]
fn truncated_and_mutated_seeds_never_panic() {
    for (_, data) in corpus() {
        for cut in 0..data.len() {
            ictus_shm::record::fuzz_scan(&data[..cut]);
        }
        for i in 0..data.len() {
            for bit in 0..8 {
                let mut m = data.clone();
                m[i] ^= 1 << bit;
                ictus_shm::record::fuzz_scan(&m);
            }
        }
    }
}
