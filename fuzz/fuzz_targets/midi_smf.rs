//! Fuzz Standard MIDI File loading, `ictus_midi::smf::Score::parse` (midly underneath).
//!
//! Besides never panicking, an accepted score must be in tick order, every event must be
//! a well-formed message, and the tempo map must give non-decreasing times.
#![no_main]

use ictus_midi::parse::Message;
use ictus_midi::smf::Score;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(score) = Score::parse(data) else {
        return;
    };
    assert!(score.format <= 1);
    let mut last_tick = 0;
    let mut last_time = std::time::Duration::ZERO;
    for e in &score.events {
        assert!(e.tick >= last_tick, "events out of tick order");
        assert!(e.tick <= score.end_tick);
        last_tick = e.tick;
        let again = Message::from_bytes(e.message.bytes(), e.message.time()).expect("a well-formed message");
        assert_eq!(again.kind(), e.message.kind());
        let t = score.tempo.time_of(e.tick);
        assert!(t >= last_time, "the tempo map went backwards");
        last_time = t;
    }
});
