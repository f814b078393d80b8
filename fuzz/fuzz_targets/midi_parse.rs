//! Fuzz the MIDI byte-stream parser, `ictus_midi::parse::Parser`.
//!
//! The first input byte sets the sysex bound (0 = the default, else 2..=256) and how the
//! bytes are chunked; the rest is the byte stream. Besides never panicking, every message
//! delivered must be well formed (it re-validates through `Message::from_bytes`), within
//! the bound, and every byte must be accounted for: delivered, supplied by running status,
//! dropped (and counted) or held in a message not yet complete.
#![no_main]

use ictus_midi::parse::{Message, Parser, DEFAULT_MAX_SYSEX};
use ictus_rt::Time;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
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
});
