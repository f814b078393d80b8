//! Fuzz the MIDI input library's check of what the server delivers,
//! `ictus_midi_api::protocol::Delivery::parse_parts`.
//!
//! The first byte picks the message id (normal or sysex delivery, or another) and
//! whether rights came with it; then a `u8` length splits the rest into in-line data and
//! one out-of-line region. Besides never panicking, an accepted delivery must carry one
//! well-formed message of its class.
#![no_main]

use ictus_midi_api::protocol::{Class, Delivery, NORMAL_MESSAGE, SYSEX_MESSAGE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&knob, rest)) = data.split_first() else { return };
    let id = match knob & 3 {
        0 => NORMAL_MESSAGE,
        1 => SYSEX_MESSAGE,
        2 => NORMAL_MESSAGE + 7,
        _ => i32::from(knob),
    };
    let rights = knob & 4 != 0;
    let Some((&len, rest)) = rest.split_first() else { return };
    let (inline, region) = rest.split_at(usize::from(len).min(rest.len()));
    let regions: Vec<&[u8]> = if knob & 8 != 0 { vec![region] } else { Vec::new() };
    if let Ok(d) = Delivery::parse_parts(id, inline, &regions, rights) {
        assert!(!rights);
        assert_eq!(Class::of(&d.message), d.class);
        let again = ictus_midi::Message::from_bytes(d.message.bytes(), d.message.time()).expect("well formed");
        assert_eq!(again.kind(), d.message.kind());
    }
});
