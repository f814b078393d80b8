//! Fuzz Standard MIDI File loading, `ictus_midi::smf::Score::parse_with` (our checked
//! layout walk, midly for the events), strictly and leniently.
//!
//! Besides never panicking: an accepted score is in tick order, every event a well-formed
//! message, the tempo map gives non-decreasing times; a strict reading accepts only a
//! file without problems, and then the lenient one gives the same events; a file refused
//! as damaged plays leniently, with its problems listed, each at an offset inside the
//! file; every error is one line.
#![no_main]

use ictus_midi::parse::Message;
use ictus_midi::smf::{Score, Strictness};
use libfuzzer_sys::fuzz_target;

fn check_score(score: &Score, len: usize) {
    assert!(score.format <= 1);
    let mut last_tick = 0;
    let mut last_time = std::time::Duration::ZERO;
    for e in &score.events {
        assert!(e.tick >= last_tick, "events out of tick order");
        assert!(e.tick <= score.end_tick);
        assert!(e.track < score.tracks);
        last_tick = e.tick;
        let again = Message::from_bytes(e.message.bytes(), e.message.time()).expect("a well-formed message");
        assert_eq!(again.kind(), e.message.kind());
        let t = score.tempo.time_of(e.tick);
        assert!(t >= last_time, "the tempo map went backwards");
        last_time = t;
    }
    assert!(score.problems.iter().all(|p| p.offset <= len as u64), "{:?}", score.problems);
}

fuzz_target!(|data: &[u8]| {
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
});
