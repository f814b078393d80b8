//! Replays the seed corpus of the `mars_node_line` fuzz target
//! (`fuzz/corpus/mars_node_line/`) on stable with the target's own check
//! (`ictus_mars_cluster::wire::fuzz_line`). `cargo test -p ictus-mars-cluster --test
//! fuzz_corpus -- --ignored write_seed_corpus` writes the seeds.

use std::path::PathBuf;

use ictus_mars_cluster::wire::{self, DirectorLine};
use ictus_mars_cluster::ClusterKey;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/mars_node_line")
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let line = |s: &str| s.trim_end_matches('\n').as_bytes().to_vec();
    let key = ClusterKey::from_bytes(&[7u8; 32]).unwrap();
    let nonce = [1u8; wire::NONCE_LEN];
    vec![
        ("seed-hello", line(&wire::hello(&key, &nonce, 1, "127.0.0.1:8080".parse().unwrap(), 12_500_000))),
        ("seed-hello-v6", line(&wire::hello(&key, &nonce, 7, "[fd00::2]:80".parse().unwrap(), 1))),
        ("seed-director-nonce", line(&wire::director_line(&DirectorLine::Nonce([0xa5; wire::NONCE_LEN])))),
        ("seed-director-welcome", line(&wire::director_line(&DirectorLine::Welcome))),
        ("seed-director-refused", line(&wire::director_line(&DirectorLine::Refused("wrong MAC".into())))),
        ("seed-bad-hello-no-mac", b"HELLO 3 127.0.0.1:1 5".to_vec()),
        ("seed-beat", line(&wire::beat(3, &["a.ts", "film.m3u8"]))),
        ("seed-beat-empty", line(&wire::beat(0, &[] as &[&str]))),
        ("seed-open", line(&wire::open(&[1, 2, u64::MAX]).unwrap())),
        ("seed-open-empty", b"OPEN".to_vec()),
        ("seed-bad-open", b"OPEN 1 x".to_vec()),
        ("seed-bad-hello", b"HELLO 3 nowhere 5".to_vec()),
        ("seed-bad-zero-capacity", b"HELLO 3 127.0.0.1:1 0".to_vec()),
        ("seed-spaces", b"BEAT +4   a.ts  ".to_vec()),
        ("seed-bad-not-utf8", vec![b'B', b'E', b'A', b'T', b' ', 0xc3]),
    ]
}

#[test]
fn fuzz_corpus_replays() {
    let d = dir();
    let mut n = 0;
    for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
        wire::fuzz_line(&std::fs::read(entry.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n >= 8, "{} has only {n} seeds", d.display());
}

#[test]
fn the_seeds_pass_the_check_and_only_the_bad_ones_are_refused() {
    for (name, s) in seeds() {
        wire::fuzz_line(&s);
        let director = name.starts_with("seed-director");
        assert_eq!(wire::parse(&s).is_err(), name.starts_with("seed-bad") || director, "{name}");
        assert_eq!(wire::parse_director(&s).is_ok(), director, "{name}");
    }
}

#[test]
#[ignore = "writes the seed corpus into fuzz/corpus"]
fn write_seed_corpus() {
    let d = dir();
    std::fs::create_dir_all(&d).unwrap();
    for (name, bytes) in seeds() {
        std::fs::write(d.join(name), bytes).unwrap();
    }
}
