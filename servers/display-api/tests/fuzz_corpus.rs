//! Replays the `display_request` fuzz target's corpus (fuzz/corpus/display_request) on
//! stable; `write_seed_corpus` (ignored) writes the seeds.

use std::path::PathBuf;

use ictus_display::proto::{fuzz_batch, items, Message, RasterOp, Rect, Request, Segment, Source};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/display_request")
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut rb = Vec::new();
    let mut sb = Vec::new();
    let img = [0x55u8; 4 * 4 * 2];
    let mut batch = Vec::new();
    for r in [
        Request::CreateWindow { id: 1, parent: 0, rect: Rect::new(0, 0, 64, 32), background: 0x102030 },
        Request::FillRects {
            window: 1,
            op: RasterOp::Xor,
            color: 0xffffff,
            rects: items(&[Rect::new(0, 0, 8, 8)], &mut rb),
        },
        Request::Segments {
            window: 1,
            op: RasterOp::Copy,
            color: 1,
            segments: items(&[Segment { x1: 0, y1: 0, x2: 9, y2: 9 }], &mut sb),
        },
        Request::Text { window: 1, x: 0, y: 0, fg: 1, bg: Some(2), text: b"seed" },
        Request::CopyArea { window: 1, src: Rect::new(0, 8, 64, 24), dx: 0, dy: 0 },
        Request::PutImage { window: 1, rect: Rect::new(0, 0, 4, 2), stride: 16, source: Source::Inline(&img) },
        Request::PresentFrame {
            window: 1,
            rect: Rect::new(0, 0, 4, 2),
            stride: 16,
            source: Source::Attachment(0),
            tag: 3,
            due_ns: 5,
        },
        Request::Sync { serial: 1, shown: true },
    ] {
        r.encode(&mut batch);
    }
    let mut one = Vec::new();
    Request::Sync { serial: 9, shown: false }.encode(&mut one);
    let mut msgs = Vec::new();
    Message::Synced { serial: 1, exec_ns: 2, requests: 3, begun_ns: 4, sent_ns: 5, acked_ns: 6 }.encode(&mut msgs);
    Message::Frame { window: 1, tag: 2, due_ns: 3, shown_ns: 4, dropped: false }.encode(&mut msgs);
    vec![("seed-empty", Vec::new()), ("seed-sync", one), ("seed-batch", batch), ("seed-messages", msgs)]
}

#[test]
#[ignore = "writes the seed corpus; run by hand when the protocol changes"]
fn write_seed_corpus() {
    std::fs::create_dir_all(dir()).expect("dir");
    for (name, data) in seeds() {
        std::fs::write(dir().join(name), data).expect("write");
    }
}

#[test]
fn the_corpus_replays_and_the_seeds_say_what_they_are() {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir())
        .expect("the corpus")
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).expect("read")))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "seeds are missing");
    for (name, data) in &files {
        assert!(std::panic::catch_unwind(|| fuzz_batch(data)).is_ok(), "{name} broke a promise");
    }
    let found = |n: &str| files.iter().find(|(f, _)| f == n).map(|(_, d)| fuzz_batch(d));
    assert_eq!(found("seed-empty"), Some(Some(0)));
    assert_eq!(found("seed-sync"), Some(Some(1)));
    assert_eq!(found("seed-batch"), Some(Some(8)));
    assert_eq!(found("seed-messages"), Some(None));
}

#[test]
fn truncated_and_mutated_seeds_never_panic() {
    for (_, data) in seeds() {
        for cut in 0..data.len() {
            fuzz_batch(&data[..cut]);
        }
        for i in 0..data.len() {
            for bit in 0..8 {
                let mut d = data.clone();
                d[i] ^= 1 << bit;
                fuzz_batch(&d);
            }
        }
    }
}
