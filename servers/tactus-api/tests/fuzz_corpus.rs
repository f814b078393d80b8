//! Replays the Tactus fuzz targets' corpora (`fuzz/corpus/tactus_{record,y4m,wav}`) on
//! stable; `write_seed_corpus` (ignored) writes the seeds.

use std::io::Cursor;
use std::path::PathBuf;

use ictus_tactus::media::{fuzz_wav, fuzz_y4m, wav::WavWriter, y4m};
use ictus_tactus::proto::{self, Control, Delivered, ItemHeader, Report, StreamKind};

fn dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target)
}

fn tagged(tag: u32, body: &[u8]) -> Vec<u8> {
    let mut v = tag.to_le_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

fn record_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut open = Vec::new();
    Control::OpenStream {
        id: 1,
        presentation: 1,
        kind: StreamKind::Video { width: 160, height: 120 },
        flags: proto::flags::REPORT,
        policy: 50_000,
        device: "display".into(),
    }
    .encode(&mut open);
    let mut start = Vec::new();
    Control::Start { presentation: 1, logical: 0, at: 0 }.encode(&mut start);
    let mut item = vec![0u8; ItemHeader::LEN + 3];
    ItemHeader { stream: 1, epoch: 0, seq: 1, logical: 100, duration: 100, sent: 1, len: 3, flags: 0 }.write(&mut item);
    let mut rep = Vec::new();
    Report::Delivered(Delivered { stream: 1, seq: 1, due: 5, ..Delivered::default() }).encode(&mut rep);
    let mut framed = Vec::new();
    proto::frame(proto::TAG_CONTROL, &start, &mut framed);
    vec![
        ("seed-open-stream", tagged(proto::TAG_CONTROL, &open)),
        ("seed-start", tagged(proto::TAG_CONTROL, &start)),
        ("seed-item", tagged(proto::TAG_ITEM, &item)),
        ("seed-delivered", tagged(1, &rep)),
        ("seed-framed", tagged(0, &framed)),
    ]
}

fn y4m_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let h = y4m::Y4mHeader { width: 4, height: 2, fps_num: 10, fps_den: 1, chroma: y4m::Chroma::C420 };
    let mut clip = Vec::new();
    y4m::write_header(&mut clip, &h).unwrap();
    let mut planes = Vec::new();
    y4m::rgb_to_yuv420(4, 2, &[0xff0000; 8], &mut planes);
    for _ in 0..2 {
        clip.extend_from_slice(b"FRAME\n");
        clip.extend_from_slice(&planes);
    }
    let mut cut = clip.clone();
    cut.truncate(cut.len() - 2);
    vec![
        ("seed-clip", clip),
        ("seed-truncated", cut),
        ("seed-mono", b"YUV4MPEG2 W2 H2 F1:1 Cmono\nFRAME\n\x10\x20\x30\x40".to_vec()),
    ]
}

fn wav_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut w = WavWriter::new(Cursor::new(Vec::new()), 8000, 1).unwrap();
    w.write(&[1, 0, 2, 0, 3, 0, 4, 0]).unwrap();
    let wav = w.finish().unwrap().into_inner();
    let mut cut = wav.clone();
    cut.truncate(cut.len() - 3);
    vec![("seed-wav", wav), ("seed-truncated", cut)]
}

fn all() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut v = Vec::new();
    v.extend(record_seeds().into_iter().map(|(n, d)| ("tactus_record", n, d)));
    v.extend(y4m_seeds().into_iter().map(|(n, d)| ("tactus_y4m", n, d)));
    v.extend(wav_seeds().into_iter().map(|(n, d)| ("tactus_wav", n, d)));
    v
}

#[test]
#[ignore = "writes the seed corpus; run by hand when the formats change"]
fn write_seed_corpus() {
    for (target, name, data) in all() {
        std::fs::create_dir_all(dir(target)).expect("dir");
        std::fs::write(dir(target).join(name), data).expect("write");
    }
}

#[test]
fn fuzz_corpus_replays() {
    let mut n = 0;
    for target in ["tactus_record", "tactus_y4m", "tactus_wav"] {
        let entries = std::fs::read_dir(dir(target)).unwrap_or_else(|e| panic!("{target} corpus: {e}"));
        for e in entries {
            let data = std::fs::read(e.unwrap().path()).unwrap();
            match target {
                "tactus_record" => {
                    proto::fuzz_one(&data);
                }
                "tactus_y4m" => {
                    fuzz_y4m(&data);
                }
                _ => {
                    fuzz_wav(&data);
                }
            }
            n += 1;
        }
    }
    assert!(n >= 10, "only {n} corpus entries");
}

#[test]
fn seeds_mean_what_they_say() {
    // The seeds exercise the decoders' success paths, not only their errors.
    for (name, data) in record_seeds() {
        assert!(proto::fuzz_one(&data), "{name}");
    }
    assert_eq!(fuzz_y4m(&y4m_seeds()[0].1), 2);
    assert_eq!(fuzz_y4m(&y4m_seeds()[1].1), 1);
    assert_eq!(fuzz_wav(&wav_seeds()[0].1), 4);
    assert_eq!(fuzz_wav(&wav_seeds()[1].1), 0);
}
