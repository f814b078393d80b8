//! Replays the `midi_delivery` fuzz target's seed corpus (fuzz/corpus/midi_delivery) on
//! stable, with the same checks as the target, so the seeds keep meaning what they say.

use ictus_midi_api::protocol::{Class, Delivery, NORMAL_MESSAGE, SYSEX_MESSAGE};

fn check(data: &[u8]) -> bool {
    let Some((&knob, rest)) = data.split_first() else { return false };
    let id = match knob & 3 {
        0 => NORMAL_MESSAGE,
        1 => SYSEX_MESSAGE,
        2 => NORMAL_MESSAGE + 7,
        _ => i32::from(knob),
    };
    let rights = knob & 4 != 0;
    let Some((&len, rest)) = rest.split_first() else { return false };
    let (inline, region) = rest.split_at(usize::from(len).min(rest.len()));
    let regions: Vec<&[u8]> = if knob & 8 != 0 { vec![region] } else { Vec::new() };
    match Delivery::parse_parts(id, inline, &regions, rights) {
        Ok(d) => {
            assert!(!rights);
            assert_eq!(Class::of(&d.message), d.class);
            true
        }
        Err(_) => false,
    }
}

#[test]
fn fuzz_corpus_replays() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/midi_delivery");
    let mut accepted = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the seed corpus") {
        let path = entry.unwrap().path();
        let ok = check(&std::fs::read(&path).unwrap());
        accepted.push((path.file_name().unwrap().to_string_lossy().into_owned(), ok));
    }
    accepted.sort();
    assert_eq!(
        accepted,
        vec![("seed-bad-time".to_string(), false), ("seed-normal".to_string(), true), ("seed-sysex".to_string(), true)]
    );
}
