//! Fuzz the clock's alarm-message parser, `ictus_clock_api::AlarmMessage::parse_bytes`.
//!
//! The first four input bytes are the message id (little-endian), the rest the in-line
//! data. Besides never panicking, an accepted message must encode back to exactly the
//! bytes it was parsed from, with the same id.
#![no_main]

use ictus_clock_api::protocol::ALARM_MESSAGE;
use ictus_clock_api::AlarmMessage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((id, bytes)) = data.split_first_chunk::<4>() else {
        return;
    };
    // Mostly the real id, so that the fuzzer spends its time past the first check.
    let id = if id[0] & 1 == 0 { ALARM_MESSAGE } else { i32::from_le_bytes(*id) };
    let Ok(m) = AlarmMessage::parse_bytes(id, bytes) else {
        return;
    };
    let again = m.to_message();
    assert_eq!(again.id, ALARM_MESSAGE);
    assert_eq!(again.data, bytes, "an accepted alarm message re-encodes to its own bytes");
});
