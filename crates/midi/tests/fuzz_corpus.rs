//! Replays the `midi_parse` fuzz target's seed corpus (`fuzz/corpus/midi_parse/`) on
//! stable, with the target's checks, so the corpus is exercised by every `cargo test`.

use std::path::PathBuf;

use ictus_midi::parse::{Message, Parser, DEFAULT_MAX_SYSEX};
use ictus_midi::smf::{Score, Strictness};
use ictus_rt::Time;

/// The same checks as `fuzz/fuzz_targets/midi_parse.rs`.
fn check(data: &[u8]) {
    let Some((&knob, bytes)) = data.split_first() else {
        return;
    };
    let max = if knob & 0x7F == 0 { DEFAULT_MAX_SYSEX } else { usize::from(knob & 0x7F) * 2 };
    let chunk = usize::from(knob >> 7) * 7 + 1;
    let mut p = Parser::with_max_sysex(max);
    let mut delivered = 0u64;
    let mut out = Vec::new();
    for (i, c) in bytes.chunks(chunk).enumerate() {
        out.clear();
        p.feed_slice(c, Time::from_nanos(i as u64), &mut out);
        for m in &out {
            assert!(m.bytes().len() <= max.max(3), "message longer than the bound: {m:?}");
            let again = Message::from_bytes(m.bytes(), m.time()).expect("delivered message must be well formed");
            assert_eq!(again.kind(), m.kind());
            delivered += m.bytes().len() as u64;
        }
        let st = p.stats();
        assert_eq!(st.bytes, delivered - st.running_status + st.dropped() + p.held(), "bytes unaccounted for");
    }
    if let Some(m) = p.finish() {
        delivered += m.bytes().len() as u64;
    }
    let st = p.stats();
    assert_eq!(p.held(), 0);
    assert_eq!(st.bytes, bytes.len() as u64);
    assert_eq!(st.bytes, delivered - st.running_status + st.dropped());
}

#[test]
fn fuzz_corpus_replays() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/midi_parse");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        check(&std::fs::read(&path).unwrap());
        n += 1;
    }
    assert!(n >= 5, "the seed corpus in {} has only {n} files", dir.display());
}

/// The same checks as `fuzz/fuzz_targets/midi_smf.rs`.
fn check_score(score: &Score, len: usize) {
    assert!(score.format <= 1);
    let mut last_tick = 0;
    let mut last_time = std::time::Duration::ZERO;
    for e in &score.events {
        assert!(e.tick >= last_tick && e.tick <= score.end_tick);
        assert!(e.track < score.tracks);
        last_tick = e.tick;
        let again = Message::from_bytes(e.message.bytes(), e.message.time()).expect("a well-formed message");
        assert_eq!(again.kind(), e.message.kind());
        let t = score.tempo.time_of(e.tick);
        assert!(t >= last_time);
        last_time = t;
    }
    assert!(score.problems.iter().all(|p| p.offset <= len as u64), "{:?}", score.problems);
}

/// The same checks as `fuzz/fuzz_targets/midi_smf.rs`.
fn check_smf(data: &[u8]) {
    let strict = Score::parse_with(data, Strictness::Strict);
    let lenient = Score::parse_with(data, Strictness::Lenient);
    if let Ok(s) = &lenient {
        check_score(s, data.len());
    }
    match (&strict, &lenient) {
        (Ok(s), Ok(l)) => {
            check_score(s, data.len());
            assert!(s.problems.is_empty() && l.problems.is_empty());
            assert_eq!(s.events, l.events);
        }
        (Ok(_), Err(e)) => panic!("strictly accepted, leniently refused: {e}"),
        (Err(e), l) => {
            assert!(!e.to_string().contains('\n'), "{e}");
            assert_eq!(e.lenient_would_play(), l.is_ok(), "{e}");
            if let Ok(l) = l {
                assert!(!l.problems.is_empty(), "refused strictly, yet no problem: {e}");
            }
        }
    }
}

#[test]
fn smf_fuzz_corpus_replays() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/midi_smf");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        check_smf(&std::fs::read(&path).unwrap());
        n += 1;
    }
    assert!(n >= 5, "the seed corpus in {} has only {n} files", dir.display());
}
