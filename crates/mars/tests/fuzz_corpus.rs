//! Replays the seed corpora of the `mars_http` and `mars_label` fuzz targets
//! (`fuzz/corpus/mars_*/`) on stable with the targets' own checks
//! (`ictus_mars::fuzz`). `cargo test -p ictus-mars --test fuzz_corpus -- --ignored
//! write_seed_corpus` writes the seeds.

use std::path::PathBuf;

use ictus_mars::label::{Geometry, Label, StreamEntry};

fn dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target)
}

fn http_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let with_len = |len: u16, req: &str| {
        let mut v = len.to_le_bytes().to_vec();
        v.extend_from_slice(req.as_bytes());
        v
    };
    vec![
        ("seed-get", with_len(1000, "GET /clip.ts HTTP/1.1\r\nHost: h\r\n\r\n")),
        ("seed-range", with_len(1000, "GET /clip.ts HTTP/1.1\r\nHost: h\r\nRange: bytes=0-99\r\n\r\n")),
        ("seed-multirange", with_len(5000, "GET /a HTTP/1.1\r\nHost: h\r\nRange: bytes=0-0, 5-9,-3, 100-\r\n\r\n")),
        ("seed-overlap", with_len(5000, "GET /a HTTP/1.1\r\nHost: h\r\nRange: bytes=0-50,10-20,40-100\r\n\r\n")),
        ("seed-head", with_len(7, "HEAD /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")),
        (
            "seed-if-range",
            with_len(300, "GET /a?rate=5 HTTP/1.1\r\nHost: h\r\nIf-Range: \"e1\"\r\nRange: bytes=-1\r\n\r\n"),
        ),
        ("seed-if-none-match", with_len(300, "GET /a HTTP/1.1\r\nHost: h\r\nIf-None-Match: W/\"e1\", \"x\"\r\n\r\n")),
        ("seed-416", with_len(1, "GET /a HTTP/1.1\r\nHost: h\r\nRange: bytes=99999-\r\n\r\n")),
        ("seed-empty-stream", with_len(0, "GET /a HTTP/1.1\r\nHost: h\r\nRange: bytes=-5\r\n\r\n")),
        ("seed-bad-path", with_len(10, "GET /../etc/passwd HTTP/1.1\r\nHost: h\r\n\r\n")),
        ("seed-body", with_len(10, "GET /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")),
        ("seed-post", with_len(10, "POST /a HTTP/1.1\r\nHost: h\r\n\r\n")),
        ("seed-partial", with_len(10, "GET /a HTTP/1.1\r\nHo")),
        ("seed-garbage", vec![0x16, 0x03, 0x01, 0x02, 0x00, 0xff, b'\r', b'\n', b'\r', b'\n']),
        ("seed-pipelined", with_len(64, "GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /a HTTP/1.1\r\nHost: h\r\n\r\n")),
        (
            "seed-absolute-form",
            with_len(
                16,
                "GET http://h:80/clip.ts?rate=500000&stream=3 HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9,20-29\r\n\r\n",
            ),
        ),
        (
            "seed-percent-and-minor",
            with_len(16, "GET /cl%69p%2Ets%2F HTTP/1.2\r\nHost: [::1]:8\r\nContent-Length: 00\r\n\r\n"),
        ),
        // Found by the fuzzer: a space before HEAD is no request line (a body is fine).
        ("seed-space-before-head", with_len(7, " HEAD /] H")),
        (
            "seed-refused-head",
            with_len(16, "HEAD /clip.ts?rate=0 HTTP/1.1\r\nHost: h\r\nRange: bytes=0-1\r\nRange: bytes=2-3\r\n\r\n"),
        ),
    ]
}

fn label_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let l = Label {
        volume_id: 42,
        index: 1,
        geometry: Geometry::new(65536, 3, 8 << 20).unwrap(),
        generation: 5,
        streams: vec![
            StreamEntry { name: "film.ts".into(), start: 0, len: 1_000_000, generation: 2 },
            StreamEntry { name: "film.m3u8".into(), start: 1_048_576, len: 900, generation: 3 },
        ],
    };
    let good = l.encode().unwrap();
    let mut bad_sum = good.clone();
    bad_sum[70] ^= 1;
    let empty = Label { streams: vec![], ..l.clone() }.encode().unwrap();
    vec![
        ("seed-label", good[..4096].to_vec()),
        ("seed-label-empty", empty[..256].to_vec()),
        ("seed-label-bad-checksum", bad_sum[..4096].to_vec()),
        ("seed-label-short", good[..100].to_vec()),
    ]
}

fn replay(target: &str, check: fn(&[u8]), min: usize) {
    let d = dir(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
        check(&std::fs::read(entry.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n >= min, "{} has only {n} seeds", d.display());
}

#[test]
fn fuzz_corpus_replays() {
    replay("mars_http", ictus_mars::fuzz::http_request, 10);
    replay("mars_label", ictus_mars::fuzz::label, 3);
}

#[test]
fn the_seeds_pass_the_checks() {
    for (_, s) in http_seeds() {
        ictus_mars::fuzz::http_request(&s);
    }
    for (_, s) in label_seeds() {
        ictus_mars::fuzz::label(&s);
    }
    // The good label seed decodes (the target would otherwise only see refusals).
    assert!(Label::decode(&label_seeds()[0].1).is_ok());
}

#[test]
#[ignore = "writes the seed corpus into fuzz/corpus"]
fn write_seed_corpus() {
    for (target, seeds) in [("mars_http", http_seeds()), ("mars_label", label_seeds())] {
        let d = dir(target);
        std::fs::create_dir_all(&d).unwrap();
        for (name, bytes) in seeds {
            std::fs::write(d.join(name), bytes).unwrap();
        }
    }
}
